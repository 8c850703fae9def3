"""The Playground's example prompts: held-out problems for the tiny synthetic pair, real-language
prompts for the real pair."""
from __future__ import annotations


def tiny_examples() -> list[list[str]]:
    """Two held-out problems per family of the synthetic task (never trained on), as Gradio examples."""
    from tasks.synthetic import make_examples

    picked, seen = [], {}
    for ex in make_examples(30, 0, "eval"):
        if seen.get(ex["family"], 0) < 2:
            seen[ex["family"]] = seen.get(ex["family"], 0) + 1
            picked.append((ex["family"], ex["messages"][0]["content"]))
    order = {"arithmetic": 0, "units": 1, "lists": 2}
    return [[q] for _, q in sorted(picked, key=lambda x: order.get(x[0], 9))]


# For the real pair: tasks the fine-tune never trained on (our prompt generator leaves out translation,
# summaries of a given text and questions about a given text on purpose), written here.
REAL_EXAMPLES = [
    ["Translate into French: The library opens at nine and closes at six."],
    ["Summarize in one sentence: The town council met on Monday to discuss the new bike lanes. Shop owners "
     "worried about parking, while parents said safer streets would let their children ride to school."],
    ["Read the text and answer the question. Text: Mia planted tomatoes in April and picked the first ones in "
     "July. Question: How many months did the tomatoes take?"],
    ["What is the capital of Japan?"],
]
