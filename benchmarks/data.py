"""The events every case runs on, made from fixed seeds."""

from __future__ import annotations

import io
import json
import random
from typing import Any

MOVIES = [
    "Alien", "Amadeus", "Brazil", "Casablanca", "Chinatown", "Fargo", "Gattaca", "Heat",
    "Her", "Jaws", "Memento", "Metropolis", "Nashville", "Psycho", "Ran", "Rashomon",
    "Rocky", "Se7en", "Solaris", "Stalker", "The Apartment", "The Conversation",
    "The Godfather", "The Thing", "Tron", "Up", "Vertigo", "WALL-E", "Zodiac", "Yojimbo",
]  # fmt: skip

MOVIE_FEATURES = {
    "user": "bytes",
    "age": "int64",
    "movie": "bytes",
    "movie_ratings": "float",
    "suggestion": "bytes",
    "suggestion_purchased": "float",
    "purchase_price": "float",
}


def movie_lines(n: int, seed: int) -> list[bytes]:
    """``n`` movie-recommendation events as JSON lines (without the newline)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        picks = rng.sample(MOVIES, rng.randint(1, 5))
        event = {
            "user": f"user-{rng.randrange(100_000)}",
            "age": rng.randrange(18, 80),
            "movie": picks,
            "movie_ratings": [round(rng.uniform(1, 5), 1) for _ in picks],
            "suggestion": rng.choice(MOVIES),
            "suggestion_purchased": float(rng.random() < 0.2),
            "purchase_price": round(rng.uniform(2, 20), 2),
        }
        lines.append(json.dumps(event).encode())
    return lines


SEQUENCE_CONTEXT: dict[str, Any] = {
    "session": "bytes",
    "user_age": "int64",
    "length": {"type": "int64", "length": True, "path": "item"},
}
SEQUENCE_LISTS = {"item": "int64", "dwell": "float", "query": "bytes"}


def sequence_lines(n: int, steps: int, seed: int) -> list[bytes]:
    """``n`` sessions of ``steps`` steps as JSON lines: parallel ``item``/``dwell``/``query``."""
    rng = random.Random(seed)
    words = ["red", "shoes", "tent", "lamp", "desk", "phone", "case", "cable", "mug", "book"]
    lines = []
    for i in range(n):
        event = {
            "session": f"session-{i:08d}",
            "user_age": rng.randrange(18, 80),
            "item": [rng.randrange(1_000_000) for _ in range(steps)],
            "dwell": [round(rng.expovariate(0.2), 3) for _ in range(steps)],
            "query": [" ".join(rng.sample(words, 2)) for _ in range(steps)],
        }
        lines.append(json.dumps(event).encode())
    return lines


def images(n: int, seed: int, target: int = 100 * 1024) -> list[tuple[str, bytes]]:
    """``n`` (file name, bytes) pairs, alternately JPEG and PNG, each near ``target`` bytes.

    A gradient with noise: the files hold entropy (they do not compress to nothing) and still
    look like pictures to a compressor (they are not incompressible either).
    """
    from PIL import Image

    rng = random.Random(seed)
    out = []
    for i in range(n):
        fmt = "JPEG" if i % 2 == 0 else "PNG"
        side = 380 if fmt == "JPEG" else 192
        noise = rng.randbytes(side * side * 3)
        img = Image.frombytes("RGB", (side, side), noise)
        grad = Image.linear_gradient("L").resize((side, side)).convert("RGB")
        img = Image.blend(grad, img, 0.5 if fmt == "JPEG" else 0.35)
        buf = io.BytesIO()
        if fmt == "JPEG":
            img.save(buf, "JPEG", quality=90)
        else:
            img.save(buf, "PNG")
        out.append((f"img-{i:05d}.{'jpg' if fmt == 'JPEG' else 'png'}", buf.getvalue()))
    return out
