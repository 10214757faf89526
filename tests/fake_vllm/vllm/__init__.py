"""A stand-in for vLLM's offline API, just what opttree.bench's peer worker calls (LLM, SamplingParams,
get_metrics, inputs.TokensPrompt), for tests without vLLM. Run by the worker in its own process (the fake
venv's python puts this folder first on the path); never imported by the test process.

It decodes greedily with the HF model in the target folder (generate()), and,
given a speculative_config, counts as vLLM does a chain of k that accepts ``step % (k + 1)`` tokens at its
verification number ``step``, cumulative over requests, what runs past max_tokens included.
``$FAKE_VLLM`` picks a behaviour: ``ties-up`` (argmax ties won by the highest token id, as another
rounding would), ``flip`` (plain only: the last token changed), ``fail-load``, ``die`` (the process exits
mid-request)."""

import os
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

__version__ = "0.0-fake"
MODE = os.environ.get("FAKE_VLLM", "")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 16
    detokenize: bool = True


@dataclass
class Metric:
    name: str
    value: int = 0


@dataclass
class Vector:
    name: str
    values: list = field(default_factory=list)


@dataclass
class Completion:
    token_ids: list


@dataclass
class RequestOutput:
    outputs: list


class LLM:
    def __init__(self, model, dtype, max_model_len, enforce_eager, max_num_seqs, seed, disable_log_stats,
                 speculative_config=None):
        print("INFO fake vllm: loading", model)  # on stdout: the worker must keep it off its replies
        if MODE == "fail-load":
            raise ValueError(f"fake vllm cannot load {model}")
        assert max_num_seqs == 1 and enforce_eager and not disable_log_stats and isinstance(seed, int)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
        self.max_model_len = max_model_len
        self.k = speculative_config["num_speculative_tokens"] if speculative_config else None
        if speculative_config:
            assert speculative_config["method"] == "eagle3" and os.path.isdir(speculative_config["model"])
        self.drafts, self.draft_tokens, self.per_pos = 0, 0, [0] * (self.k or 0)

    def generate(self, prompts, params, use_tqdm=True):
        assert params.temperature == 0.0 and len(prompts) == 1
        if MODE == "die":
            os._exit(3)
        ids = list(prompts[0]["prompt_token_ids"])
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt and max_tokens exceed max_model_len {self.max_model_len}")
        processors = LogitsProcessorList([ties_up] if MODE == "ties-up" else [])
        with torch.no_grad():
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      do_sample=False, max_new_tokens=params.max_tokens, logits_processor=processors,
                                      temperature=None, top_p=None, top_k=None)
        new = out[0, len(ids):].tolist()
        if MODE == "flip" and self.k is None:
            new[-1] = (new[-1] + 1) % self.model.config.vocab_size
        if self.k:
            self.count_chain(len(new))
        return [RequestOutput([Completion(new)])]

    def count_chain(self, new_tokens: int) -> None:
        done, step = 1, 0  # the prefill's token: no draft
        while done < new_tokens:
            accepted = step % (self.k + 1)
            self.drafts += 1
            self.draft_tokens += self.k
            for i in range(accepted):
                self.per_pos[i] += 1
            done += accepted + 1
            step += 1

    def get_metrics(self):
        if self.k is None:
            return [Metric("vllm:num_requests_running", 0)]
        return [Metric("vllm:spec_decode_num_drafts", self.drafts),
                Metric("vllm:spec_decode_num_draft_tokens", self.draft_tokens),
                Metric("vllm:spec_decode_num_accepted_tokens", sum(self.per_pos)),
                Vector("vllm:spec_decode_num_accepted_tokens_per_pos", list(self.per_pos))]




def ties_up(input_ids, scores):  # scores: [1, V] float32
    """Only the highest token id among the top scores left: argmax ties won upward."""
    ids = torch.arange(scores.shape[-1])
    best = torch.where(scores == scores.max(-1, keepdim=True).values, ids, -1).max(-1).values  # [1]
    out = torch.full_like(scores, float("-inf"))
    out[0, best] = scores[0, best]
    return out
