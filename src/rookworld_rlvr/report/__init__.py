"""The run report: PNG plots and a self-contained HTML page of one or several GRPO runs (or SFT bases).

    runs.py     read run directories (metrics, evaluations, guard events, config, summary)
    plots.py    the figures (training curves, evaluations, time per phase; the sweep's gains)
    samples.py  sample completions drawn on boards
    markup.py   escaping, number cells, the stylesheet
    page.py     the HTML page and `write_report`
    sft.py      the report of a model `rookworld sft` made, from its log
    cli.py      `rookworld report`

A report is most useful for broken runs, so every part tolerates missing files and keys, NaN
values and a half-written last JSONL line; an undrawable FEN leaves out only its board.

Owns reading runs back and showing them. Imports no torch (matplotlib and chess.svg inside
functions), nothing of the model or trainer.
"""
