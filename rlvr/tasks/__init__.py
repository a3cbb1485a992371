"""Built-in tasks and dataset loading (docs/architecture.md).

``get_task("arithmetic")`` (the default job's task), ``get_task("countdown")``, ``get_task("word_problems")``,
``get_task("gsm8k", path=...)`` and ``get_task("file", path=..., answer_column=...)`` build tasks;
``load_rows`` / ``load_gsm8k`` read files into rows. Importing this package registers the tasks in
``TASKS`` and their checkers (``arithmetic``, ``countdown``) in ``rlvr.rewards.base.REWARDS``.
"""

from rlvr.tasks.arithmetic import ArithmeticTask, ExactIntegerReward, check_integer
from rlvr.tasks.base import HELD_OUT_PER_MILLE, TASKS, Row, Task, get_task, is_held_out
from rlvr.tasks.countdown import CountdownReward, CountdownTask, check_countdown, evaluate_equation
from rlvr.tasks.loaders import FileTask, gsm8k_final_answer, load_gsm8k, load_rows
from rlvr.tasks.word_problems import WordProblemTask

__all__ = [
    "HELD_OUT_PER_MILLE",
    "TASKS",
    "ArithmeticTask",
    "CountdownReward",
    "CountdownTask",
    "ExactIntegerReward",
    "FileTask",
    "Row",
    "Task",
    "WordProblemTask",
    "check_countdown",
    "check_integer",
    "evaluate_equation",
    "get_task",
    "gsm8k_final_answer",
    "is_held_out",
    "load_gsm8k",
    "load_rows",
]
