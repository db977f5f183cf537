"""The prompts step 4 sends: short ones, a long one of a chosen token length, chat messages.

Fixed English text so that results are comparable between runs and machines; the long
prompt is built from the same sentences in a seeded order and cut to an exact token count
with the model's own tokenizer (so "long" means the same thing for every model).
"""

from __future__ import annotations

import random
from typing import Any

SHORT_PROMPTS = (
    "The history of the printing press",
    "Once upon a time, in a small village by the sea,",
    "To install the package, first",
    "The three primary colors are",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "In the morning the engineers checked the servers and",
    "Q: What is the capital of France?\nA:",
)

TINY_PROMPTS = ("Hi", "Hello")
"""One to a few tokens: the smallest prefill shapes (kernels pick other paths for them)."""

SENTENCES = (
    "The engineers measured the latency of every request and wrote the numbers down.",
    "A river runs through the valley, and the town grew up along its banks.",
    "Each server in the rack reported its temperature, power draw and memory use.",
    "The old library kept maps of coastlines that no longer look the way they did.",
    "When the cache is warm the answer arrives quickly; when it is cold, it takes longer.",
    "She opened the notebook and copied the table of results into the report.",
    "Trains leave the central station every ten minutes during the busy hours.",
    "The model reads the prompt, builds its cache, and then writes one token at a time.",
    "In winter the lake freezes and the children skate across it after school.",
    "Good tests fail when the code is wrong and pass when the code is right.",
    "The committee met on Tuesday to decide which machines would be upgraded first.",
    "Numbers printed with too few digits hide the errors that matter most.",
)

CHAT_MESSAGES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "Tell me a short story about a lighthouse."},),
    ({"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "List three uses of a server rack."}),
)


IMAGE_QUESTIONS = (
    "Describe this picture.",
    "What colours does the image show?",
    "What is in the image?",
)


def image_prompts(count: int) -> list[tuple[str, str]]:
    """``count`` (question, image name) pairs of a multimodal prompt set: the questions and the
    images of :data:`adaptcheck.frameworks.multimodal.IMAGE_NAMES` in turn."""
    from adaptcheck.frameworks.multimodal import IMAGE_NAMES

    return [(IMAGE_QUESTIONS[i % len(IMAGE_QUESTIONS)], IMAGE_NAMES[i % len(IMAGE_NAMES)]) for i in range(count)]


def reference_prompts(count: int, seed: int = 0) -> list[str]:
    """The short prompts the float64 reference answers: for seed 0 the fixed set in order
    (results comparable between runs and machines); any other run seed draws its own from
    the short prompts and the sentences' openings, so repeated runs of one real model (whose
    weights do not change with the seed) see different sequences."""
    if seed == 0:
        return [SHORT_PROMPTS[i % len(SHORT_PROMPTS)] for i in range(count)]
    pool = list(SHORT_PROMPTS) + [" ".join(s.split()[:7]) for s in SENTENCES]
    rng = random.Random(f"reference-prompts:{seed}")
    return [pool[i] for i in rng.sample(range(len(pool)), min(count, len(pool)))] + \
        [rng.choice(pool) + f" ({i})" for i in range(max(0, count - len(pool)))]


def long_text(seed: int = 0, sentences: int = 200) -> str:
    """A long passage: the sentences in a seeded order (the same for a given seed)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(SENTENCES) for _ in range(sentences))


def long_prompt_ids(tokenizer: Any, tokens: int, seed: int = 0) -> list[int]:
    """Exactly ``tokens`` token ids of long text in the model's tokenizer (no special tokens
    added, so every framework sees the same ids)."""
    sentences = 64
    while True:
        ids = list(tokenizer(long_text(seed, sentences), add_special_tokens=False)["input_ids"])
        if len(ids) >= tokens:
            return [int(t) for t in ids[:tokens]]
        sentences *= 2


def short_prompt_ids(tokenizer: Any, count: int, offset: int = 0) -> list[list[int]]:
    """``count`` short prompts as token ids (cycling through the fixed set)."""
    texts = [SHORT_PROMPTS[(offset + i) % len(SHORT_PROMPTS)] for i in range(count)]
    return [[int(t) for t in tokenizer(t, add_special_tokens=False)["input_ids"]] for t in texts]
