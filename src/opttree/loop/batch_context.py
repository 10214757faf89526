"""generate()'s logits processors on one row of a batch, given what plain generate() gives them.

Plain generate() calls its processors once per token on the whole batch, ``input_ids`` [B, L] and
``scores`` [B, vocab], every row at its own batch index. Some processors read more than a row's own
tokens: ``PrefixConstrainedLogitsProcessor`` calls the user's function with the row's ``batch_id``,
``RepetitionPenaltyLogitsProcessor`` holds one ``prompt_ignore_length`` per row (a left-padded batch),
the encoder processors one prompt per row, and a user's processor may hold anything batch-shaped.
opttree's rows advance at their own pace, so a node of row b is processed on its own, and such a
processor gets the batch as plain would hold it at that length: row b is the node's context at
index b, every other row c its committed tokens up to that length (right-padded with the pad token
where it has fewer, as plain pads a finished row); row b's scores are taken from the result.

Stock processors that read nothing but a row's own tokens and scores (:data:`ROW_WISE`) get row b
alone, as before: the batch costs them nothing. With one row there is nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .rows import Row

#: stock processors whose row b depends only on row b's tokens and scores (the exact class: a
#: subclass may add batch state)
ROW_WISE = (
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "TopHLogitsWarper", "MinPLogitsWarper",
    "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper", "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor", "NoRepeatNGramLogitsProcessor", "SequenceBiasLogitsProcessor",
    "NoBadWordsLogitsProcessor", "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
    "InfNanRemoveLogitsProcessor", "ExponentialDecayLengthPenalty", "LogitNormalization",
    "SuppressTokensAtBeginLogitsProcessor", "SuppressTokensLogitsProcessor", "WatermarkLogitsProcessor",
)


def row_wise(processor) -> bool:
    return type(processor).__module__.startswith("transformers.") and type(processor).__name__ in ROW_WISE


@dataclass
class BatchContext:
    """Every row of one decode, in the caller's batch order (finished rows included)."""

    rows: list[Row]
    pad_token_id: int

    def context(self, b: int, own: torch.Tensor) -> torch.Tensor:
        """own: [L] long, row b's context at a node -> [B, L]: the batch as plain holds it at length L."""
        length = own.shape[0]
        batch = torch.full((len(self.rows), length), self.pad_token_id, dtype=own.dtype, device=own.device)
        for c, row in enumerate(self.rows):
            tokens = own if c == b else row.sequence[:length]
            batch[c, :tokens.shape[0]] = tokens
        return batch

    def process(self, logits_processor, b: int, own: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Row b's processed scores ([vocab]) at a node with context ``own`` ([L] long) and raw
        ``scores`` ([vocab]): each processor in turn, as generate()'s LogitsProcessorList calls them."""
        batch = None
        for processor in logits_processor:
            if row_wise(processor):
                scores = processor(own[None, :], scores[None, :])[0]
                continue
            batch = self.context(b, own) if batch is None else batch  # [B, L]
            full = scores[None, :].repeat(len(self.rows), 1)  # [B, vocab]; other rows' are never read back
            scores = processor(batch, full)[b]
        return scores


def processing(logits_processor, rows: list[Row], pad_token_id: int | None):
    """``apply(b, context [L], scores [vocab]) -> [vocab]``: generate()'s processors on row b (the
    caller's batch index) at a node; one row: the list called on that row, as generate() would."""
    if len(rows) == 1:
        return lambda b, own, scores: logits_processor(own[None, :], scores[None, :])[0]
    batch = BatchContext(list(rows), 0 if pad_token_id is None else pad_token_id)
    return lambda b, own, scores: batch.process(logits_processor, b, own, scores)
