"""The texts the benchmark workloads and the guess head's training prompts are built from; they
ship with the project (no downloads).

Passages are our own short expository texts; code comes from the Python standard library that
every installation carries (read with `inspect`, so it is whatever the running Python ships);
chat questions are open-ended, with nothing in the prompt for prompt lookup to copy.
"""

from __future__ import annotations

import importlib
import inspect

PASSAGES: dict[str, str] = {
    "lighthouses": (
        "Lighthouses were built to mark dangerous coastlines, hazardous shoals, reefs and safe entries "
        "to harbours. Early lighthouses burned wood or coal in open fires on top of towers; later ones "
        "used oil lamps with reflectors. The Fresnel lens, invented in 1822 by the French physicist "
        "Augustin-Jean Fresnel, concentrated the light of a single lamp into a powerful horizontal beam "
        "that could be seen more than twenty miles away. Each lighthouse was given its own pattern of "
        "flashes, so that sailors could tell one light from another at night. Keepers lived at the "
        "stations, trimming wicks, winding the clockwork that turned the lens and cleaning soot from the "
        "glass. Electrification and automation in the twentieth century made resident keepers "
        "unnecessary, and today most lights are monitored remotely, while satellite navigation has "
        "taken over much of their original role."
    ),
    "honeybees": (
        "A honeybee colony is made up of a single queen, a few hundred drones and tens of thousands of "
        "worker bees. The queen lays up to two thousand eggs a day during the summer. Drones are male "
        "bees whose only task is to mate with a queen from another colony. Workers are females that do "
        "not reproduce; their duties change as they age. Young workers clean cells and feed larvae, "
        "middle-aged workers build comb, store food and guard the entrance, and the oldest workers "
        "forage for nectar, pollen, water and resin. A forager that finds a rich patch of flowers "
        "returns to the hive and performs a waggle dance, whose angle and duration tell her sisters the "
        "direction and distance of the food. In winter the colony survives by clustering together and "
        "shivering its flight muscles to produce heat, living on the honey stored during the summer."
    ),
    "railway_time": (
        "Before the railways, every town in Britain kept its own local time, set by the position of the "
        "sun. Bristol ran about ten minutes behind London, and nobody minded, because travel between "
        "the two took the better part of a day. Fast trains changed that. Timetables that listed a "
        "different local time at every station confused passengers and caused near misses on single "
        "track lines. In 1840 the Great Western Railway adopted London time for all its stations, and "
        "other companies soon followed. By 1855 most public clocks in Britain showed Greenwich Mean "
        "Time, although it only became the legal standard in 1880. In North America the railways "
        "introduced four standard time zones in 1883, and an international conference in Washington "
        "the following year chose the meridian through Greenwich as the prime meridian of the world."
    ),
    "sourdough": (
        "Sourdough bread is leavened by a starter, a mixture of flour and water colonised by wild yeasts "
        "and lactic acid bacteria. The yeasts produce carbon dioxide, which makes the dough rise, while "
        "the bacteria produce lactic and acetic acids, which give the bread its sour taste and help it "
        "keep longer. A baker feeds the starter regularly with fresh flour and water, discarding part of "
        "it each time so that the culture stays active. To make a loaf, some of the starter is mixed "
        "with more flour, water and salt, and the dough is left to ferment slowly for several hours, "
        "often overnight in a cool place. Long fermentation develops flavour and makes the bread easier "
        "to digest. The dough is then shaped, proved once more and baked in a very hot oven, often "
        "inside a covered pot that traps steam and lets the crust form slowly."
    ),
    "glaciers": (
        "A glacier forms where more snow falls in winter than melts in summer. Over many years the "
        "accumulated snow is compressed into dense glacial ice, and once the ice is thick enough it "
        "begins to flow downhill under its own weight. Glaciers move in two ways: the ice deforms "
        "internally, and the whole glacier slides over its bed on a thin film of meltwater. As they "
        "move, glaciers pluck rocks from the ground and grind them against the bedrock, carving "
        "U-shaped valleys, sharp ridges and deep basins that later fill with water to become lakes. "
        "The rock debris they carry is dropped where the ice melts, forming ridges called moraines. "
        "Most glaciers in the world are now shrinking, and their retreat is one of the clearest signs "
        "of a warming climate; in many mountain regions they also supply the rivers that cities and "
        "farms depend on during dry summers."
    ),
    "printing_press": (
        "Johannes Gutenberg developed a printing press with movable metal type in Mainz around 1440. "
        "His system combined several inventions: a hand mould for casting large numbers of identical "
        "letters, an alloy of lead, tin and antimony that melted at a low temperature and cooled quickly, "
        "an oil-based ink that stuck to metal, and a screw press adapted from those used to make wine. "
        "A skilled team could print thousands of pages a day, compared with the few pages a scribe "
        "could copy by hand. Within fifty years printing shops had opened in more than two hundred "
        "European cities, and millions of books had been produced. Cheaper books spread literacy, helped "
        "standardise languages and spelling, and allowed scientific results to be shared and checked "
        "far more widely than before."
    ),
}

# For each passage, a question answered by the passage itself.
QUESTIONS: dict[str, str] = {
    "lighthouses": "Who invented the Fresnel lens, and what did it do?",
    "honeybees": "What do the oldest worker bees do?",
    "railway_time": "When did Greenwich Mean Time become the legal standard in Britain?",
    "sourdough": "Why does sourdough bread taste sour?",
    "glaciers": "How do glaciers move?",
    "printing_press": "Which inventions did Gutenberg's printing system combine?",
}

# Standard-library functions whose source the code-rewriting tasks quote (module, attribute).
CODE_FUNCTIONS: tuple[tuple[str, str], ...] = (
    ("textwrap", "indent"),
    ("shlex", "quote"),
    ("string", "capwords"),
    ("statistics", "median"),
    ("colorsys", "rgb_to_hsv"),
    ("html", "escape"),
    ("colorsys", "hls_to_rgb"),
    ("calendar", "leapdays"),
)

CHAT_QUESTIONS: tuple[str, ...] = (
    "Give me three ideas for a birthday party for a ten-year-old.",
    "Why is the sky blue? Explain it simply.",
    "Write a short story about a robot who learns to paint.",
    "What are some good habits for staying focused while studying?",
    "Suggest a name for a coffee shop by the sea and explain your choice.",
    "What should I pack for a weekend hiking trip in the mountains?",
    "Describe the taste of a lemon to someone who has never had one.",
    "Write a limerick about a cat who loves cheese.",
    "What is the difference between weather and climate?",
    "How can I make my small apartment feel bigger?",
    "Invent a new board game and describe its rules.",
    "What would happen if the moon disappeared?",
    "Give advice to someone starting their first job.",
    "Write a friendly letter inviting a neighbour to dinner.",
    "Why do people enjoy listening to music?",
    "Plan a three-course vegetarian dinner menu.",
)


def code_snippets() -> list[tuple[str, str]]:
    """(qualified name, source) of the code functions this Python ships the source of."""
    snippets = []
    for module_name, attribute in CODE_FUNCTIONS:
        try:
            source = inspect.getsource(getattr(importlib.import_module(module_name), attribute))
        except (OSError, TypeError):  # a Python installed without its .py files
            continue
        snippets.append((f"{module_name}.{attribute}", source.rstrip()))
    return snippets


def with_typos(text: str, every: int = 5) -> str:
    """Swap two inner letters of every `every`-th long word: a deterministic spelling-fix task."""
    words = text.split(" ")
    for i in range(every - 1, len(words), every):
        w = words[i]
        if len(w) >= 5 and w.isalpha():
            mid = len(w) // 2
            words[i] = w[: mid - 1] + w[mid] + w[mid - 1] + w[mid + 1 :]
    return " ".join(words)
