import logging, sys, torch, random
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from opttree.distill.features import load_features
from opttree.distill.head_train import HeadTrainConfig, train_head
from opttree.smollm2 import load_smollm2
t, tok = load_smollm2()
data = []
for d in ('features', 'features_extra', 'features_data2'):
    data += load_features('/work/cache/eagle/' + d)
random.Random(1).shuffle(data)
print(len(data), sum(len(r['input_ids']) for r in data), flush=True)
cfg = HeadTrainConfig(num_kept_tokens=8192, init_layer=-1, unroll=int(sys.argv[4]), epochs=float(sys.argv[2]),
                      batch_tokens=int(sys.argv[5]), max_len=512, lr=float(sys.argv[6]), eval_every=100, seed=0,
                      max_minutes=float(sys.argv[3]), bf16=True, val_fraction=0.03)
r = train_head(t, data, sys.argv[1], cfg, always_keep=[2])
print(r)
