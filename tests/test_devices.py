"""Devices and dtypes: half precision, accelerate-dispatched and offloaded models, draft and
target on different devices. Every dtype and device is taken from the models (no ``.cuda()``);
the ``gpu`` tests run where CUDA is available and are skipped elsewhere (conftest.py)."""

import pytest
import torch
import transformers as tf
from transformers import DynamicCache

from models import VOCAB, peaked, tiny_model
from opttree import speculative_generate
from opttree.drafters import MixedDrafter, ModelDrafter
from opttree.hf.compat import with_cache
from opttree.tree.masks import verification_inputs
from test_masks import path_logits, random_tree

HALF = [torch.bfloat16, torch.float16]



def prompt(seed=0, length=7):
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))


def spec(target, draft, ids, **kw):
    return target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                           return_dict_in_generate=True, nodes=8, threshold=0.1, max_depth=5, **kw)


def tolerance(dtype, logits: torch.Tensor) -> float:
    """Two units of rounding at the logits' magnitude: what reordered half-precision sums may differ by."""
    return 2 * torch.finfo(dtype).eps * float(logits.abs().max())


def tree_logits(model, prefix, tree, bool_mask=False):
    """The verification forward's logits [n + 1, vocab] float32 (optionally with a bool mask)."""
    cache = DynamicCache(config=model.config)
    model(prefix[None, :-1], **with_cache(model, cache), use_cache=True)
    inputs = verification_inputs(int(prefix[-1]), tree, len(prefix) - 1, model.dtype)
    if bool_mask:
        inputs.attention_mask = inputs.attention_mask == 0  # True where visible
    return model(**inputs.as_kwargs(), **with_cache(model, cache), use_cache=True, logits_to_keep=0).logits[0].float()


def max_path_error(model, prefix, tree, logits) -> float:
    errors = [(logits[0] - path_logits(model, prefix, [])).abs().max()]
    for i in range(len(tree)):
        expected = path_logits(model, prefix, tree.tokens[tree.path_to(i)].tolist())
        errors.append((logits[i + 1] - expected).abs().max())
    return float(max(errors))


# -- half precision --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "phi3", "gpt2"])
def test_half_precision_node_logits_equal_path_logits(family, attn, dtype):
    model = peaked(tiny_model(family, attn=attn, dtype=dtype), scale=30.0)  # logits ~10: rounding shows
    prefix = torch.randint(3, 90, (9,), generator=torch.Generator().manual_seed(0))
    tree = random_tree(12, 90, seed=1)
    with torch.inference_mode():
        logits = tree_logits(model, prefix, tree)
        assert max_path_error(model, prefix, tree, logits) <= tolerance(dtype, logits)


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_the_tolerance_catches_a_bool_mask_in_bf16_eager(family):
    """Negative control: a bool 4D mask gives wrong logits in bf16 with eager attention (the reason
    tree/masks.py builds additive masks in the model dtype); the tolerance above must see it."""
    model = peaked(tiny_model(family, attn="eager", dtype=torch.bfloat16), scale=30.0)
    prefix = torch.randint(3, 90, (9,), generator=torch.Generator().manual_seed(0))
    tree = random_tree(12, 90, seed=1)
    with torch.inference_mode():
        logits = tree_logits(model, prefix, tree, bool_mask=True)
        assert max_path_error(model, prefix, tree, logits) > 3 * tolerance(torch.bfloat16, logits)


@pytest.mark.parametrize("family,attn,dtype", [
    ("llama", "eager", torch.bfloat16), ("llama", "sdpa", torch.bfloat16), ("qwen3", "eager", torch.bfloat16),
    ("phi3", "sdpa", torch.bfloat16), ("gpt2", "eager", torch.bfloat16), ("opt", "sdpa", torch.bfloat16),
    ("llama", "sdpa", torch.float16), ("gpt2", "eager", torch.float16),
], ids=str)
def test_half_precision_greedy_equals_generate(family, attn, dtype):
    """On a peaked target (top-2 margins of several logits, far above half-precision rounding),
    the argmax never depends on the order of the sums, so equality is exact."""
    target = peaked(tiny_model(family, attn=attn, dtype=dtype), scale=30.0)
    drafts = {"agree": target, "unrelated": tiny_model(family, seed=1, attn=attn, dtype=dtype),
              "prompt_lookup": "prompt_lookup"}
    ids = prompt(1)
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    for name, draft in drafts.items():
        out = spec(target, draft, ids, max_new_tokens=20)
        assert torch.equal(out.sequences, ref), name
    assert spec(target, target, ids, max_new_tokens=20).stats.mean_accepted_tokens > 2


def test_draft_and_target_of_different_dtypes():
    target = peaked(tiny_model("llama", dtype=torch.bfloat16), scale=30.0)
    drafts = [peaked(tiny_model("llama", dtype=torch.float32), scale=30.0),  # the target's weights, fp32
              MixedDrafter(tiny_model("llama", seed=1, dtype=torch.float16), "prompt_lookup", 0.5)]
    ids = prompt(2)
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    for draft in drafts:
        assert torch.equal(spec(target, draft, ids, max_new_tokens=20).sequences, ref)


# -- accelerate: device maps and offloading --------------------------------------------------------

@pytest.fixture(scope="module")
def saved_target(tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    target = peaked(tiny_model("llama"), scale=30.0)
    target.save_pretrained(path)
    return target, path


def test_target_loaded_with_a_device_map(saved_target):
    target, path = saved_target
    mapped = tf.AutoModelForCausalLM.from_pretrained(path, device_map={"": "cpu"}, attn_implementation="sdpa")
    ids = prompt(3)
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    for draft in (tiny_model("llama", seed=1), "prompt_lookup", target):
        assert torch.equal(spec(mapped, draft, ids, max_new_tokens=20).sequences, ref)


def test_target_with_layers_offloaded_to_disk(saved_target, tmp_path):
    target, path = saved_target
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}
    offloaded = tf.AutoModelForCausalLM.from_pretrained(path, device_map=device_map, offload_folder=str(tmp_path),
                                                        attn_implementation="sdpa")
    assert offloaded.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # really offloaded
    ids = prompt(4)
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    out = spec(offloaded, target, ids, max_new_tokens=20)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_accepted_tokens > 2  # the cache surgery worked through the offload hooks


def test_cpu_offloaded_draft_and_target():
    from accelerate import cpu_offload

    target = peaked(tiny_model("qwen2"), scale=30.0)
    ids = prompt(5)
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    draft = cpu_offload(peaked(tiny_model("qwen2"), scale=30.0), execution_device=torch.device("cpu"))
    assert draft.device.type == "meta"  # the parameters live off the model: inputs go to the hook's device
    assert ModelDrafter(draft).device == torch.device("cpu")
    offloaded_target = cpu_offload(peaked(tiny_model("qwen2"), scale=30.0), execution_device=torch.device("cpu"))
    out = spec(offloaded_target, draft, ids, max_new_tokens=20)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_accepted_tokens > 2


# -- CUDA (skipped without a GPU) ------------------------------------------------------------------

def _pair_on(target_device, draft_device, dtype=torch.float32, family="llama"):
    target = peaked(tiny_model(family, dtype=dtype), scale=30.0).to(target_device)
    draft = peaked(tiny_model(family, dtype=dtype), scale=30.0).to(draft_device)  # the target's weights
    unrelated = tiny_model(family, seed=1, dtype=dtype).to(draft_device)
    return target, draft, unrelated


@pytest.mark.gpu
@pytest.mark.parametrize("target_device,draft_device", [("cpu", "cuda:0"), ("cuda:0", "cpu"), ("cuda:0", "cuda:0")])
def test_draft_and_target_on_different_devices(target_device, draft_device):
    target, draft, unrelated = _pair_on(target_device, draft_device)
    ids = prompt(6).to(target_device)
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    for d in (draft, unrelated, "prompt_lookup", MixedDrafter(unrelated, "prompt_lookup", 0.5)):
        out = spec(target, d, ids, max_new_tokens=24)
        assert out.sequences.device == ids.device
        assert torch.equal(out.sequences, ref)
    assert spec(target, draft, ids, max_new_tokens=24).stats.mean_accepted_tokens > 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3"])
def test_half_precision_on_cuda(family, dtype):
    target, draft, unrelated = _pair_on("cuda:0", "cuda:0", dtype, family)
    ids = prompt(7).to("cuda:0")
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    for d in (draft, unrelated, "prompt_lookup"):
        assert torch.equal(spec(target, d, ids, max_new_tokens=24).sequences, ref)


@pytest.mark.gpu
def test_target_dispatched_over_cuda_and_cpu(tmp_path):
    target = peaked(tiny_model("llama"), scale=30.0)
    target.save_pretrained(tmp_path / "t")
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                  "model.norm": "cpu", "lm_head": "cpu"}
    split = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "t", device_map=device_map, attn_implementation="sdpa")
    ids = prompt(8)
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    for d in (target.to("cuda:0"), "prompt_lookup"):
        out = spec(split, d, ids.to("cuda:0"), max_new_tokens=24)
        assert torch.equal(out.sequences.cpu(), ref)


# -- the GPU step (issue: a step a GPU can afford) ---------------------------------------------------

@pytest.mark.gpu
def test_feature_head_decoding_on_cuda():
    from opttree.distill.train.head import new_head

    target = peaked(tiny_model("llama"), scale=30.0).to("cuda:0")
    head, _ = new_head(target)
    head = head.to("cuda:0")
    ids = prompt(9).to("cuda:0")
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    for d in (head, MixedDrafter(head, "prompt_lookup", 0.5)):
        assert torch.equal(spec(target, d, ids, max_new_tokens=24).sequences, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("generator_device", ["cpu", "cuda:0"])
def test_sampling_on_cuda_with_the_users_generator(generator_device):
    """A CPU generator with a CUDA target draws on the CPU (a generator only draws on its own
    device); the same seed gives the same tokens twice."""
    target = peaked(tiny_model("llama"), scale=3.0).to("cuda:0")
    draft = tiny_model("llama", seed=1).to("cuda:0")
    ids = prompt(10).to("cuda:0")
    outs = []
    for _ in range(2):
        gen = torch.Generator(device=generator_device).manual_seed(0)
        outs.append(target.generate(ids, do_sample=True, top_k=0, max_new_tokens=16, custom_generate=speculative_generate,
                                    draft_model=draft, generator=gen, nodes=8, max_depth=4))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.gpu
def test_cuda_target_with_a_bf16_draft():
    target = peaked(tiny_model("llama"), scale=30.0).to("cuda:0")
    draft = peaked(tiny_model("llama", dtype=torch.bfloat16), scale=30.0).to("cuda:0")
    ids = prompt(11).to("cuda:0")
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(spec(target, draft, ids, max_new_tokens=24).sequences, ref)


@pytest.mark.gpu
def test_a_cuda_step_syncs_a_few_times():
    """torch.cuda's sync debug mode warns at every synchronising call: a greedy step with a fixed
    budget syncs about once per drafted layer plus a constant few (walk, commit)."""
    import warnings

    target = peaked(tiny_model("llama"), scale=300.0).to("cuda:0")
    draft = peaked(tiny_model("llama"), scale=300.0).to("cuda:0")
    ids = prompt(12).to("cuda:0")
    spec(target, draft, ids, max_new_tokens=8)  # warm-up
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = spec(target, draft, ids, max_new_tokens=60)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    steps = len(out.stats.steps)
    depth = sum(s.tree_depth for s in out.stats.steps) / steps
    assert syncs / steps <= depth + 6, (syncs, steps, depth)
