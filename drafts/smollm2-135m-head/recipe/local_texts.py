"""Texts found on this machine, shared by gen2.py and gen3.py (imported from this folder)."""
import gettext, glob, gzip
from pathlib import Path

import pydoc_data.topics as T


def german_strings() -> list[str]:
    """German UI strings of the gettext catalogues: six words or more, no format codes, one line."""
    german = []
    for f in sorted(glob.glob("/usr/share/locale/de/LC_MESSAGES/*.mo")):
        try:
            cat = gettext.GNUTranslations(open(f, "rb"))._catalog
        except Exception:
            continue
        german += [v for k, v in cat.items() if isinstance(v, str) and len(v.split()) >= 6 and "%" not in v and "\n" not in v.strip()]
    return german


def english_documents() -> list[str]:
    """Long, mostly-prose files of /usr/share/doc (no copyright or changelog), then the pydoc topics."""
    docs = []
    for f in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
        p = Path(f)
        if not p.is_file() or p.stat().st_size < 3000 or "copyright" in p.name or "changelog" in p.name.lower():
            continue
        try:
            text = (gzip.open(p, "rt", errors="ignore") if p.suffix == ".gz" else open(p, errors="ignore")).read()
        except Exception:
            continue
        if sum(c.isalpha() or c.isspace() for c in text[:3000]) > 0.85 * 3000:
            docs.append(text)
    return docs + list(T.topics.values())
