"""Features of the round-3 texts (gen3.py): one bf16-autocast teacher-forced target forward each.
The run for the shipped head was stopped after 129 shards (4,128 of the 5,038 unique texts, in
this script's shuffled order), to leave time for training; N_TEXTS (default 4128) reproduces that.
Usage: extract3.py [N_TEXTS]"""
import glob, logging, random, sys, torch
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from opttree.distill.data import load_round
from opttree.distill.features import unique_sequences, extract_features
from opttree.smollm2 import load_smollm2
recs = [r for d in sorted(glob.glob('/work/cache/eagle/data3/part_*')) for r in load_round(d)]
seqs = unique_sequences(recs, 1024)
random.Random(0).shuffle(seqs)
seqs = seqs[:int(sys.argv[1]) if len(sys.argv) > 1 else 4128]
print(len(recs), len(seqs), sum(len(s) for s in seqs), flush=True)
t, tok = load_smollm2()
extract_features(t, seqs, '/work/cache/eagle/features_data3', topk=16, shard_size=32, bf16=True)
