"""The token ids of the stage-A/B texts (the CPU feature caches), for gpu5.py train.
Usage: old_ids.py OUT.npz  (reads /work/cache/eagle/features{,_extra,_data2,_data3})"""
import sys

import numpy as np

from opttree.distill.features import load_features

ids = []
for d in ("features", "features_extra", "features_data2", "features_data3"):
    ids += [r["input_ids"].numpy().astype(np.uint16) for r in load_features("/work/cache/eagle/" + d)]
np.savez_compressed(sys.argv[1], tokens=np.concatenate(ids), offsets=np.cumsum([0] + [len(x) for x in ids]))
print(len(ids), "texts")
