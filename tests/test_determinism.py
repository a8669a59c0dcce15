"""Results repeat for a seed on CPU, across processes. Each trainer below runs with seeds 3 and 4 in one fresh Python
process, and with 4 and 3 (the trainers in the opposite order too) in another: for each seed the two processes
must end with bit-identical weights (and logs), whichever run came first in its process; the other seed must give
other weights (so the hash sees the seed). One pair of processes serves every trainer: a fresh interpreter
spends seconds importing PyTorch and TransformerLens before it trains anything."""
from helpers import hashes_in_fresh_process

TRAINERS = {
    "markov": """from coreinv.tasks.markov import CHAINS, markov_chain, train_markov
model, _ = train_markov(markov_chain(*CHAINS["real"]), seed=seed, steps=15, d_model=32, seq_len=16, batch=32)
print(state_hash(model))""",
    "grokking": """import json
from coreinv.tasks.grokking.data import modular_data
from coreinv.tasks.grokking.training import log_columns, make_modular_model, train_modular
data = modular_data(11, 0.5, seed=seed)
model = make_modular_model(11, n_layers=2, d_model=32, n_heads=4, d_mlp=64, seed=seed)
log, _ = train_modular(model, data, 30, lr=3e-3, weight_decay=1.0, schedule="onecycle", pct_start=0.1,
                       seed=seed, log_every=10, progress=False)
print(state_hash(model, json.dumps(log_columns(log)["test_acc"].tolist()).encode()))""",
    "sae": """from test_sae import X
from coreinv.sae import SparseAutoencoder
print(state_hash(SparseAutoencoder(kind="topk", k=3, steps=60, progress=False, seed=seed).fit(X).sae_))""",
}


def test_two_fresh_processes_train_identical_models():
    first = hashes_in_fresh_process(TRAINERS, (3, 4))
    second = hashes_in_fresh_process(dict(reversed(TRAINERS.items())), (4, 3))
    for name in TRAINERS:
        (a3, a4), (b4, b3) = first[name], second[name]
        assert a3 == b3 and a4 == b4, f"{name}: one seed, two processes, other weights"
        assert a3 != a4, f"{name}: seeds 3 and 4 give the same weights"
