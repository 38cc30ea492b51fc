"""Generic controller machinery: controller-runtime's ideas, asyncio-native, no pko semantics.

Data flows one way: watch -> cache -> queue -> reconcile -> API writes. One line per module:

* ``resource``: raw JSON requests for one resource type (list, watch, get, create, replace,
  patch, server-side apply, delete with preconditions) and discovery (``served``).
* ``kubeclient``: the HTTP client on aiohttp every request goes through (auth, TLS, proxy,
  ``User-Agent``, ``ApiException``); no kubernetes-asyncio.
* ``kubeconfig``: where that client connects and as whom (in-cluster, kubeconfig files).
* ``kubeconfigfile``: kubeconfig files merged and read (standard library only: the agent's too).
* ``store``: the thread-safe indexed cache behind an informer, and key and index functions.
* ``informer``: list+watch into a store (a reflector), fanned out to event handlers.
* ``informerfactory``: one shared informer per resource type, with per-informer selectors.
* ``workqueue`` / ``delayingqueue`` / ``ratelimitingqueue``: client-go's queue layers.
* ``ratelimit``: per-item exponential and overall token-bucket rate limiters.
* ``controller``: N workers reconciling keys from a queue (``Result``, ``TerminalError``).
* ``predicates``: composable event filters (generation, annotation, conditions, ...).
* ``recentwrites``: read-your-writes over a cache (writes not yet watched back), owned by each
  informer (``informer.wrote``/``informer.latest``): the one stale-read guard.
* ``writes``: the two write rules: a status only if it changed (``StatusWriter``), an object only
  if its digest changed (``DigestApplier``).
* ``executor``: carrying out a reconcile's plan: writes in order, the plan from the last answer,
  expected failures handed to the plan (``execute``), for every reconciler.
* ``objects``: owner references and finalizers.
* ``conditions``: ``metav1.Condition`` list helpers.
* ``events``: a Kubernetes Event recorder with client-go's aggregation and spam filter.
* ``leaderelection``: a Lease-based elector, as client-go's.
* ``manager``: wires informers, controllers, runnables, leader election, probes and metrics, and
  hands out clients carrying its API timeout (``Manager.client``).
* ``builder``: declaring a controller (``ControllerBuilder``: ``for_``, ``owns``, ``watches``, ...).
* ``handler``: the one event handler (``Enqueuer``): filter, map to keys, enqueue.
* ``source``: keys from outside the informers (``KeyChannel``).
* ``metrics``: controller-runtime's Prometheus series for queues and controllers.
* ``serving``: the ``/healthz``, ``/readyz`` and ``/metrics`` HTTP servers.
"""
