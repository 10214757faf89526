"""Go on training head3 on all four feature sets, answer positions only.
Validation = head3's validation texts (same split as train3.py) + 3 % of the new texts.
The number of epochs is set so that the cosine schedule ends in about MINUTES at RATE positions/s.
Usage: train4.py OUT MINUTES LR BATCH_TOKENS RATE"""
import logging, sys, torch, random
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from opttree.distill.features import answer_marker, load_features
from opttree.distill.head_train import HeadTrainConfig, chunks, train_head
from opttree.distill.train import split_records
from opttree.smollm2 import load_smollm2
out, minutes, lr, batch_tokens, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
t, tok = load_smollm2()
marker = answer_marker(tok)
old = []
for d in ('features', 'features_extra', 'features_data2'):
    old += load_features('/work/cache/eagle/' + d)
random.Random(1).shuffle(old)
old_train, old_val = split_records(old, 0.03, 0)  # exactly train3.py's split
new_train, new_val = split_records(load_features('/work/cache/eagle/features_data3'), 0.03, 0)
train, val = old_train + new_train, old_val + new_val
positions = sum(len(p['input_ids']) for p in chunks(train, 512, marker, answers_only=True))
epochs = rate * 60 * minutes / positions
print(len(train), 'train texts,', positions, 'positions per epoch ->', round(epochs, 2), 'epochs;', len(val), 'val texts', flush=True)
cfg = HeadTrainConfig(unroll=3, epochs=epochs, batch_tokens=batch_tokens, max_len=512, lr=lr, eval_every=100,
                      seed=0, max_minutes=minutes * 1.15, bf16=True, answers_only=True)
r = train_head(t, train, out, cfg, always_keep=[2], answer_marker=marker, init='/work/cache/eagle/head3',
               val_records=val)
print(r)
