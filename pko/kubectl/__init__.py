"""The kubectl plugin ``kubectl pko`` (console script ``kubectl-pko``): a Stack's status, why it is
not Ready, its engine output, and a retry, from the user's kubeconfig (issue 29).

One module, one job:

* ``__main__``: the entry point; parse, connect, run, map every failure to an exit code.
* ``args``: the command line (kubectl's ``-n``, ``-A``, ``--context``, ``--kubeconfig``, ``-o``)
  and the table of commands; imports only argparse, so ``--help`` is instant.
* ``exitcodes``: 0 ok, 1 not Ready, 2 usage, 3 not found, 4 not supported, 5 API unreachable or
  refused.
* ``kubeconfig``: which kubeconfig files, context and default namespace, as kubectl chooses.
* ``cluster``: the edge: the reads and the one write (the reconciliation-request annotation).
* ``stackview``: readiness, times and secret masking, shared by the commands (pure).
* ``status``, ``why``, ``logs``, ``actions``: each command's decisions and formatting (pure).
* ``commands``: each command's run: read, decide, print, return the exit code.
"""
