"""The kubectl plugin ``kubectl pko`` (console script ``kubectl-pko``): a Stack's status, why it is
not Ready, its engine output; a retry, a one-off refresh, a cancel, and the approval of a recorded
plan, from the user's kubeconfig (issue 29). Documented in docs/kubectl-pko.md.

One module, one job:

* ``__main__``: the entry point; parse, connect, run, map every failure to an exit code.
* ``args``: the command line (kubectl's ``-n``, ``-A``, ``--context``, ``--kubeconfig``, ``-o``)
  and the table of commands; imports only argparse, so ``--help`` is instant.
* ``exitcodes``: 0 ok, 1 not Ready, 2 usage, 3 not found, 4 refused (nothing to approve), 5 API
  unreachable or failed, 6 forbidden (RBAC or the approval policy), 7 ``--wait`` timed out.
* ``kubeconfig``: which kubeconfig files, context and default namespace, as kubectl chooses.
* ``credentials``: the context's cluster and user as an endpoint (CA, certificates, tokens, exec).
* ``apiserver``: the HTTP client, on the standard library alone: the plugin also ships as one
  file that runs on any CPython >= 3.11 (hack/build_plugin.py, docs/kubectl-pko.md).
* ``cluster``: the edge: the reads, the one kind of write (an annotation of a Stack) and the watch
  of one Stack that ``--wait`` is.
* ``stackview``: readiness, times and secret masking, shared by the commands (pure).
* ``status``, ``why``, ``logs``, ``actions`` (retry, refresh, cancel), ``approval``, ``versions``: each
  command's decisions and formatting (pure).
* ``commands``: each command's run: read, decide, print, return the exit code.
"""
