import logging, torch, random
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from opttree.distill.data import load_round
from opttree.distill.features import unique_sequences, extract_features
from opttree.smollm2 import load_smollm2
recs = load_round('/work/cache/eagle/data2/round1') + load_round('/work/cache/eagle/data2/round2')
seqs = unique_sequences(recs, 1024)
random.Random(0).shuffle(seqs)
print(len(recs), len(seqs), sum(len(s) for s in seqs), flush=True)
t, tok = load_smollm2()
extract_features(t, seqs, '/work/cache/eagle/features_data2', topk=16, shard_size=32, bf16=True)
