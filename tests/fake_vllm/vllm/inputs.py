"""vllm.inputs.TokensPrompt: a dict of prompt_token_ids, as vLLM's TypedDict is."""


def TokensPrompt(prompt_token_ids):  # noqa: N802 - vLLM's name
    return {"prompt_token_ids": list(prompt_token_ids)}
