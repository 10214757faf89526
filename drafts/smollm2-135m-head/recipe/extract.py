import logging, torch, random
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from opttree.distill.data import load_round
from opttree.distill.features import unique_sequences, extract_features
from opttree.smollm2 import load_smollm2
recs=[]
for d in ['data/round1','data/round2','data_a/round1','data_c/round1','data_c/round2']:
    recs += load_round('/work/cache/distill/smollm2/'+d)
seqs = unique_sequences(recs, 1024)
random.Random(0).shuffle(seqs)
print(len(recs), len(seqs), sum(len(s) for s in seqs))
t,tok=load_smollm2()
extract_features(t, seqs, '/work/cache/eagle/features', topk=16, shard_size=32)
