"""The carried width's former home, kept only for the two modules that still import it from here
(``drafters/feature_head.py`` and ``loading/head_file.py``, being moved by the EAGLE heads' work):
once they import :mod:`opttree.hf.width`, delete this module (tests/test_house.py lists them)."""

from .width import carried_embedding, carried_rows, carried_width, text_config

__all__ = ["carried_embedding", "carried_rows", "carried_width", "text_config"]
