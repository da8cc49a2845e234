"""The four-word runs of fixed text in generator templates: what a reader rule keyed on a template's wording would contain."""
import re


def word_runs(texts, n: int=4) -> set:
    "Every run of `n` words of the fixed text in `texts` (placeholders such as {v} split a template into its fixed parts)."
    out = set()
    for x in texts:
        for part in re.split(r'\{\w+\}', x):
            w = re.findall(r"[A-Za-z']+", part.lower())
            out |= {' '.join(w[i:i + n]) for i in range(len(w) - n + 1)}
    return out
