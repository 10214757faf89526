"""load_smollm2() reads the GGUF once per machine (transformers' GGUF reader spends about 20 s a load parsing it)
and keeps the dequantised model as a plain folder: that folder is the GGUF's model and tokenizer exactly, later
loads read no GGUF, and a folder converted from another GGUF is converted again."""

import json

import pytest
import torch

from opttree import smollm2
from threads import real_model_threads


@pytest.mark.real_model
@pytest.mark.slow
def test_the_converted_folder_is_the_ggufs_model_and_tokenizer_and_later_loads_read_no_gguf(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(real_model_threads())
    try:
        gguf_model, gguf_tok = smollm2._from_gguf(smollm2.fetch_smollm2(), None)
        model, tok = smollm2.load_smollm2()
        assert getattr(model, "hf_quantizer", None) is None and getattr(gguf_model, "hf_quantizer", None) is not None
        ours, theirs = model.state_dict(), gguf_model.state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        assert model.generation_config.to_dict() == gguf_model.generation_config.to_dict()
        assert (model.config.vocab_size, model.config.num_hidden_layers, model.dtype) == (49152, 30, torch.float32)
        text = tok.apply_chat_template([{"role": "user", "content": "Name three primary colours."}], tokenize=False,
                                       add_generation_prompt=True)
        assert text == gguf_tok.apply_chat_template([{"role": "user", "content": "Name three primary colours."}],
                                                    tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt").input_ids
        assert torch.equal(ids, gguf_tok(text, return_tensors="pt").input_ids)
        assert torch.equal(model.generate(ids, max_new_tokens=12, do_sample=False),
                           gguf_model.generate(ids, max_new_tokens=12, do_sample=False))
        read = []
        monkeypatch.setattr(smollm2, "_from_gguf", lambda *a: read.append(a) or (gguf_model, gguf_tok))
        again, _ = smollm2.load_smollm2(dtype=torch.bfloat16)
        assert read == [] and again.dtype == torch.bfloat16  # a count: the GGUF is not read again
        smollm2.load_smollm2(path=smollm2.fetch_smollm2())  # control: a GGUF folder given is read as given
        assert len(read) == 1
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """opttree's cache in tmp_path, a stand-in GGUF fetched there (bytes: only its sha256 is read), and conversions
    that write a small folder."""
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / smollm2.GGUF_FILE).write_bytes(b"GGUF stand-in")
    monkeypatch.setenv("OPTTREE_CACHE", str(tmp_path))
    saved = []

    def save(model, tokenizer, folder, record):
        saved.append(record)
        folder.mkdir()
        (folder / smollm2.SOURCE_RECORD).write_text(json.dumps(record))

    monkeypatch.setattr(smollm2, "_from_gguf", lambda folder, dtype: ("model", "tokenizer"))
    monkeypatch.setattr(smollm2, "_save", save)
    return tmp_path, saved


def test_a_folder_converted_from_another_gguf_or_without_a_record_is_converted_again(cache):
    root, saved = cache
    folder = root / smollm2.CONVERTED
    right = smollm2.source_record(root / "smollm2" / smollm2.GGUF_FILE)
    for stale in ({**right, "sha256": "0" * 64}, None):
        folder.mkdir()
        (folder / "model.safetensors").write_text("stale")
        if stale:
            (folder / smollm2.SOURCE_RECORD).write_text(json.dumps(stale))
        saved.clear()
        assert smollm2.converted_smollm2() == folder
        assert saved == [right] and not (folder / "model.safetensors").exists()
        assert smollm2.converted_smollm2() == folder and saved == [right]  # control: a matching record is kept
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


def test_a_conversion_another_process_finished_first_is_used_and_a_wrong_one_is_not(cache, monkeypatch):
    root, _ = cache
    folder = root / smollm2.CONVERTED
    right = smollm2.source_record(root / "smollm2" / smollm2.GGUF_FILE)

    def lost_the_race(record):
        def save(model, tokenizer, target, _):
            target.mkdir()
            (target / smollm2.SOURCE_RECORD).write_text(json.dumps(record))
            raise OSError(f"[Errno 39] Directory not empty: {target}")  # as written_whole's rename then fails
        return save

    monkeypatch.setattr(smollm2, "_save", lost_the_race(right))
    assert smollm2.converted_smollm2() == folder
    (folder / smollm2.SOURCE_RECORD).unlink()
    folder.rmdir()
    monkeypatch.setattr(smollm2, "_save", lost_the_race({**right, "sha256": "1" * 64}))
    with pytest.raises(OSError, match="Directory not empty"):
        smollm2.converted_smollm2()
