"""The SPMD instances of one launch, traced as cooperating threads.

On hardware the logical cores of ``kernel[2]`` (``nl.nc(2)``) run at the same
time and meet at ``nisa.sendrecv`` and ``nisa.core_barrier``. Here each
instance's Python body runs in its own thread; one runs at a time, until it
finishes or waits at a meeting point for its partner, so the program's
instructions are issued in an order the cores could have run them in. With no
meeting points the instances run one after another, as before. The logical cores of a Gen-2
``kernel[lnc]`` launch (``interleave``) instead take turns instruction by instruction, as cores
running at the same pace would, so neither runs far ahead of the other between meetings.
"""
from __future__ import annotations

import threading


class _Abort(BaseException):
    """Unwinds the other instances' threads when one of them failed."""


class Lockstep:
    def __init__(self, tr, pids, run_instance, interleave=False):
        self.tr, self.pids, self.run_instance = tr, pids, run_instance
        self.interleave = interleave
        self.in_action = False
        self.cv = threading.Condition()
        self.state = {i: "ready" for i in range(len(pids))}
        self.turn = 0
        self.error = None
        self.meetings = {}
        self.results = [None] * len(pids)

    def run(self):
        threads = [threading.Thread(target=self._thread, args=(i,), daemon=True) for i in range(len(self.pids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.error is not None:
            raise self.error
        return self.results

    def _thread(self, i):
        from . import _emit
        _emit.set_current(self.tr)
        self.tr.start_instance(self.pids[i], lockstep=self, index=i)
        try:
            with self.cv:
                self._wait_turn(i)
            self.results[i] = self.run_instance(self.pids[i])
        except _Abort:
            return
        except BaseException as e:  # noqa: BLE001 - re-raised by run() in the launching thread
            with self.cv:
                if self.error is None:
                    self.error = e
                self.state[i] = "done"
                self.cv.notify_all()
            return
        with self.cv:
            self.state[i] = "done"
            self._pass_turn()

    def _wait_turn(self, i):
        while self.error is None and (self.turn != i or self.state[i] == "blocked"):
            self.cv.wait()
        if self.error is not None:
            raise _Abort

    def _pass_turn(self):
        ready = [j for j, s in sorted(self.state.items()) if s == "ready"]
        if not ready and any(s == "blocked" for s in self.state.values()) and self.error is None:
            waiting = ", ".join(f"{key[0]} #{key[-1]} of core(s) {sorted(a)}" for key, a in self.meetings.items())
            self.error = RuntimeError(f"NKI instances wait for partners that finished without meeting them: {waiting}")
        self.turn = ready[0] if ready else None
        self.cv.notify_all()

    def step(self):
        """After each instruction of an interleaved launch: the next ready core takes its turn."""
        if not self.interleave or self.in_action:
            return
        me = self.tr.instance_index
        with self.cv:
            n = len(self.pids)
            nxt = next((j for j in ((me + d) % n for d in range(1, n)) if self.state[j] == "ready"), None)
            if nxt is None:
                return
            self.turn = nxt
            self.cv.notify_all()
            self._wait_turn(me)

    def meet(self, key, rank, participants, payload, action):
        """Waits until every rank of ``participants`` has reached meeting ``key``; the last to
        arrive runs ``action({rank: payload})`` (issuing the instructions of the exchange)."""
        me = self.tr.instance_index
        with self.cv:
            arrivals = self.meetings.setdefault(key, {})
            if rank in arrivals:
                raise RuntimeError(f"{key[0]}: core {rank} reached the same meeting twice")
            arrivals[rank] = (payload, me)
            if set(arrivals) >= set(participants):
                del self.meetings[key]
                self.in_action = True
                try:
                    action({r: p for r, (p, _) in arrivals.items()})
                finally:
                    self.in_action = False
                for r, (_, j) in arrivals.items():
                    if j != me:
                        self.state[j] = "ready"
                if len({j for _, j in arrivals.values()}) > 1:
                    self.tr.synced = True
                return
            self.state[me] = "blocked"
            self._pass_turn()
            self._wait_turn(me)
