"""Train the target's guess head (specdec/engine/guess.py) on the target's own greedy outputs,
and write those outputs as its phrase index (specdec/speculation/phrases.py's PhraseIndex).

    specdec train-guess-head [--profile P] [--out FILE] [--phrases FILE]   (25-45 minutes on 2 cores)

1. The model writes a paragraph on each of TOPICS; those paragraphs are the passages of the
   grounded tasks (summarise, proofread, answer from), as the benchmarks' own passages are
   never used, so that their held-out figures stay held out. Open questions on the same topics
   and functions of the standard library to rewrite make up the rest.
2. The model answers every prompt greedily: its own outputs are what the head must predict.
3. One forward over each prompt and output gives the hidden state h_t of every output row;
   the head learns token t+2 from (h_t, token t+1), cross-entropy over the whole vocabulary.
4. The candidates the head scores at run time are the tokens the outputs use most.
5. The outputs, each led by its prompt's last tokens, are the phrase index.
"""

from __future__ import annotations

import importlib
import inspect
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file

from specdec.config import Profile
from specdec.engine.engine import Engine, GenerationRequest
from specdec.progress import console, progress_bar
from specdec.speculation.phrases import phrase_tokens
from specdec.texts import with_typos
from specdec.tokenizer import TextTokenizer

TOPICS = [
    "volcanoes",
    "coral reefs",
    "the printing press",
    "solar panels",
    "the human heart",
    "black holes",
    "the Roman aqueducts",
    "composting",
    "electric cars",
    "the water cycle",
    "chess openings",
    "the invention of the telephone",
    "penguins",
    "recycling plastic",
    "the Great Wall of China",
    "vaccines",
    "tides",
    "the stock market",
    "bread baking",
    "photosynthesis",
    "the Silk Road",
    "earthquakes",
    "wind turbines",
    "the immune system",
    "bicycles",
    "glaciers",
    "coffee cultivation",
    "the Internet",
    "dinosaurs",
    "rainforests",
    "the Olympic Games",
    "submarines",
    "bees and pollination",
    "the moon landing",
    "hurricanes",
    "paper making",
    "the piano",
    "deserts",
    "antibiotics",
    "public libraries",
    "sleep",
    "the Renaissance",
    "octopuses",
    "3D printing",
    "the metric system",
    "marathon running",
    "tea ceremonies",
    "the Amazon river",
    "lightning",
    "compost worms",
    "the history of money",
    "the Eiffel Tower",
    "bird migration",
    "batteries",
    "the violin",
    "nuclear power",
    "spiders",
    "the first airplanes",
    "cheese making",
    "the ozone layer",
    "classical ballet",
    "cloud computing",
    "whales",
    "the Industrial Revolution",
    "microscopes",
    "origami",
    "the Sahara",
    "vitamins",
    "skyscrapers",
    "hot air balloons",
    "the pyramids of Giza",
    "password security",
    "rainbows",
    "the postal service",
    "elephants",
    "mushrooms",
    "the steam engine",
    "sourdough",
    "satellites",
    "wolves",
    "the history of chocolate",
    "noise pollution",
    "telescopes",
    "yoga",
    "the Dead Sea",
    "fire fighting",
    "the camera",
    "honey",
    "the Arctic",
    "board games",
    "traffic lights",
    "tornadoes",
    "the guitar",
    "owls",
    "clean drinking water",
    "the human brain",
    "ancient Greek theatre",
    "typewriters",
    "the periodic table",
    "kites",
    "urban gardening",
    "the Mona Lisa",
    "jellyfish",
    "fermentation",
    "the Panama hat",
    "the bicycle helmet",
    "space stations",
    "maple syrup",
    "sea turtles",
    "the compass",
    "the Vikings",
    "glassblowing",
    "the rain gauge",
    "lichens",
    "credit cards",
    "the Andes",
    "thunderstorms",
    "carpentry",
    "the history of the calendar",
    "zebras",
    "wildfires",
    "knitting",
    "the lighthouse keeper",
    "radio",
    "the Mediterranean diet",
    "geysers",
    "the abacus",
    "hummingbirds",
    "clock making",
    "the Nile",
    "electric guitars",
    "salt mining",
    "the Hubble telescope",
    "desert plants",
    "medieval castles",
    "the bicycle courier",
    "video games",
    "snow leopards",
    "ink",
    "windmills",
]
PASSAGE = "Write an informative paragraph of about 120 words about {t}."
OPEN = (
    "Explain {t} to a beginner.",
    "Write a short paragraph about {t}.",
    "What are three interesting facts about {t}?",
    "Why does {t} matter to people today?",
    "Write a short story that involves {t}.",
    "Give me some tips related to {t}.",
    "What are the advantages and disadvantages of {t}?",
    "Describe {t} in simple words for a child.",
)
SUMMARISE = (
    "Summarize the following text in two or three sentences:\n\n{p}",
    "What is the main idea of this passage?\n\n{p}",
    "{p}\n\nSummarize the passage above briefly.",
    "Give a short summary of the text below.\n\n{p}",
)
PROOFREAD = (
    "Correct the spelling errors in this text and return it in full:\n\n{p}",
    "Proofread the following paragraph:\n\n{p}",
    "Fix the typos in the following text:\n\n{p}",
)
ANSWER = (
    "{p}\n\nAccording to the passage, what is said about {t}?",
    "{p}\n\nQuestion: What are the key points of the text above?",
    "Read the text and answer: which facts does it give?\n\n{p}",
    "{p}\n\nBased on this text, why is {t} notable?",
)
CODE_MODULES = (
    "json.decoder", "difflib", "fractions", "heapq", "bisect", "ipaddress", "base64", "glob", "posixpath",
    "csv", "copy", "pprint", "random", "tokenize", "urllib.parse", "email.utils", "gzip", "zipfile", "argparse",
)  # fmt: skip
CODE = (
    "Rewrite this Python function with clearer variable names:\n\n{c}",
    "Add type hints to this function:\n\n{c}",
    "Add a docstring to this Python function and return the whole function:\n\n{c}",
    "Explain what this function does:\n\n{c}",
    "Refactor this code to be more readable:\n\n{c}",
)
# as good as 4096 on held-out prompts (benchmarks/copy_bound.py priced 2.57x against 2.59x), at a
# quarter of the product
NUM_CANDIDATES = 1024


@dataclass
class TrainOptions:
    hidden: int = 512  # the MLP's width
    epochs: int = 3
    batch: int = 512
    lr: float = 2e-3
    weight_decay: float = 0.1
    max_tokens: int = 128
    seed: int = 0


def code_functions() -> list[str]:
    """Short functions of CODE_MODULES, as this Python ships them."""
    out = []
    for name in CODE_MODULES:
        module = importlib.import_module(name)
        functions = [f for _, f in inspect.getmembers(module, inspect.isfunction) if f.__module__ == module.__name__]
        for f in functions[:6]:
            try:
                source = inspect.getsource(f)
            except OSError:  # a Python without its .py files
                continue
            if 4 <= source.count("\n") <= 30:
                out.append(source.rstrip())
    return out


def generate(engine: Engine, tokenizer: TextTokenizer, texts: list[str], max_tokens: int, label: str):
    """(prompt ids, greedy output ids) of each text, as chat prompts, a batch of kv slots at a time."""
    prompts = [np.asarray(tokenizer.encode(tokenizer.chat_prompt(t)), dtype=np.int64) for t in texts]
    out: list[tuple[np.ndarray, np.ndarray]] = []
    batch = len(engine.slots.slots)
    with progress_bar() as bar:
        task = bar.add_task(label, total=len(prompts))
        for i in range(0, len(prompts), batch):
            chunk = prompts[i : i + batch]
            requests = [GenerationRequest(p, max_new_tokens=max_tokens, end_id=tokenizer.eos_id) for p in chunk]
            for p, result in zip(chunk, engine.generate(requests), strict=True):
                if isinstance(result, Exception):
                    raise result
                out.append((p, np.asarray(result.tokens, dtype=np.int64)))
            bar.advance(task, len(chunk))
    return out


def training_data(engine: Engine, tokenizer: TextTokenizer, options: TrainOptions):
    """(prompt ids, greedy output ids) of every training prompt, the passages' own included."""
    rng = random.Random(options.seed)
    written = generate(engine, tokenizer, [PASSAGE.format(t=t) for t in TOPICS], 200, "passages")
    texts = []
    for topic, (_, ids) in zip(TOPICS, written, strict=True):
        passage = tokenizer.decode([int(t) for t in ids if t != tokenizer.eos_id]).strip()
        texts += [q.format(t=topic) for q in OPEN]
        texts += [q.format(p=passage) for q in SUMMARISE]
        texts += [q.format(p=with_typos(passage, rng.choice([3, 4, 5, 7]))) for q in PROOFREAD]
        texts += [q.format(p=passage, t=topic) for q in ANSWER]
    texts += [q.format(c=c) for c in code_functions() for q in CODE]
    return written + generate(engine, tokenizer, texts, options.max_tokens, "outputs")


def prefill_hidden(engine: Engine, seq: np.ndarray, rows: np.ndarray) -> torch.Tensor:
    """The final hidden states of `rows` of one prefill of `seq` in slot 0 of an otherwise idle
    engine: bit for bit those the rows have in the decoding."""
    n = len(seq)
    t = torch.from_numpy(seq)
    return engine.model.hidden(
        engine.cache, t, torch.arange(n), torch.zeros(n, dtype=torch.int64), torch.from_numpy(rows)
    )


def examples(engine: Engine, pairs: list[tuple[np.ndarray, np.ndarray]]):
    """(h_t, token t+1, token t+2) over every output row t of each (prompt, output)."""
    hidden, nxt, target = [], [], []
    with progress_bar() as bar:
        task = bar.add_task("hidden states", total=len(pairs))
        for prompt, output in pairs:
            seq = np.concatenate([prompt, output])
            rows = np.arange(len(prompt) - 1, len(seq) - 2)  # row t produced seq[t + 1]
            if len(rows):
                t = torch.from_numpy(seq)
                # a plain tensor (not an inference one): training keeps it for backward
                hidden.append(prefill_hidden(engine, seq, rows).float().clone())
                nxt.append(t[rows + 1])
                target.append(t[rows + 2])
            bar.advance(task)
    return torch.cat(hidden), torch.cat(nxt), torch.cat(target)


class Head(torch.nn.Module):
    def __init__(self, size: int, width: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(2 * size, width)
        self.fc2 = torch.nn.Linear(width, size)
        torch.nn.init.zeros_(self.fc2.weight)  # starts as the model's own next-token guess
        torch.nn.init.zeros_(self.fc2.bias)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(torch.nn.functional.silu(self.fc1(torch.cat([h, e], dim=1))))


def fit(h: torch.Tensor, nxt: torch.Tensor, target: torch.Tensor, table: torch.Tensor, options: TrainOptions) -> Head:
    torch.manual_seed(options.seed)
    head = Head(h.shape[1], options.hidden)
    steps_per_epoch = len(target) // options.batch
    opt = torch.optim.AdamW(head.parameters(), lr=options.lr, weight_decay=options.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=options.lr, total_steps=options.epochs * steps_per_epoch, pct_start=0.1
    )
    table_bf16 = table.to(torch.bfloat16)
    with progress_bar() as bar:
        task = bar.add_task("training", total=options.epochs * steps_per_epoch)
        for epoch in range(options.epochs):
            order, right, seen = torch.randperm(len(target)), 0, 0
            for i in range(steps_per_epoch):
                idx = order[i * options.batch : (i + 1) * options.batch]
                z = head(h[idx], table[nxt[idx]])
                with torch.autocast("cpu", dtype=torch.bfloat16):  # the vocabulary product: AMX where there is one
                    logits = z @ table_bf16.T
                loss = torch.nn.functional.cross_entropy(logits.float(), target[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                schedule.step()
                right += int((logits.argmax(1) == target[idx]).sum())
                seen += len(idx)
                bar.advance(task)
            console.print(f"epoch {epoch + 1}: loss {loss.item():.3f}, training accuracy {right / seen:.1%}")
    return head


def train_guess_head(profile: Profile, out: Path, phrases: Path, options: TrainOptions | None = None) -> None:
    options = options or TrainOptions()
    model_dir = profile.model_dir("target")
    eng = profile.engine
    engine = Engine(model_dir, dtype=eng.dtype, kv_slots=eng.kv_slots, max_seq_len=1280, threads=eng.threads)
    tokenizer = TextTokenizer(model_dir)
    pairs = training_data(engine, tokenizer, options)
    h, nxt, target = examples(engine, pairs)
    console.print(f"{len(pairs)} prompts, {len(target)} examples")
    table = engine.model.embedding(torch.arange(engine.vocab_size))  # the engine's own, as GuessHead reads it
    head = fit(h, nxt, target, table, options)
    counts = np.bincount(np.concatenate([o for _, o in pairs]), minlength=engine.vocab_size)
    candidates = torch.from_numpy(np.argsort(-counts, kind="stable")[:NUM_CANDIDATES].astype(np.int64))
    weights = {name: t.detach().contiguous() for name, t in head.state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({**weights, "candidates": candidates}, str(out), metadata={"profile": profile.name})
    phrases.parent.mkdir(parents=True, exist_ok=True)
    save_numpy({"tokens": phrase_tokens(pairs)}, str(phrases), metadata={"profile": profile.name})
