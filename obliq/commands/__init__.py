"""Every ``obliq`` command, one module per top-level verb (litgpt's layout): ``obliq synth generate`` is
:func:`obliq.commands.synth.generate`, ``obliq task split`` :func:`obliq.commands.task.split_task`, ``obliq train``
:mod:`obliq.commands.train`. A command checks its arguments, claims its outputs (:mod:`obliq.claims`), calls the
library (every other package of obliq/) and returns its report; :data:`obliq.cli.COMMANDS` maps each name to its
function. A new command: its module here (or a function in its verb's module), one line in that table, a test.
"""
