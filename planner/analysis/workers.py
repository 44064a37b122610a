"""The analysis's re-solves on several processes (``planner plan --jobs N``; by default one per core, up to four,
where the plan's own solve is slow enough to pay for them).

Each question of the analysis (:func:`planner.analysis.questions.questions`: the runner-up, a limit, an SLO, the demand or
the working set of one workload made 10% looser) is one MILP re-solve that starts from the plan and changes
nothing the others see, so they can run at once. The planning process answers questions itself and starts
``N - 1`` worker processes; each is handed the scenario, the candidate pool, the plan's model data, the plan and
its solution once, builds its own copy of the model and its own HiGHS instance (one thread), and is handed
questions one at a time, in the order they are asked (the dearest first, as in one process), as it becomes free.
The answers are those one process gives; only the time to get them changes. The command's ``--time-limit`` binds
every process (a question asked after it is spent comes back unanswered, as in one process).

Workers are fresh interpreters talking over their stdin and stdout (``python -c``, importing the planning
process's own planner package), never forked from the planning process (whose HiGHS task scheduler may have
threads a fork would not copy) and never re-running the caller's ``__main__`` (as ``multiprocessing``'s spawn
does: a script without a main guard would run again). A worker that dies (killed, out of memory) costs no
answer: what it had not answered is re-solved in the planning process.

Workers started ahead (:class:`Workers`) also evaluate part of the candidate pool while the planning process
evaluates the rest (:func:`evaluate_beside`): the scenario's hardware, one at a time, the planning process taking
them from the first, a worker from the last; the parts are joined in the scenario's order
(:func:`planner.perf.candidates.merge_pools`), so the pool is the one one process evaluates.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

from planner.analysis.context import AnalysisContext, Answer, Question
from planner.analysis.questions import answer_here, together
from planner.catalog.scenario import ResolvedScenario
from planner.options import PlanOptions

STOP = None
"""Sent to a worker in place of a question's index: no more questions, exit."""
READY = "ready"
"""A worker's first word: its model is built, it takes questions."""


class Workers:
    """Worker processes started ahead of the analysis, so that their start-up (an interpreter, the planner's
    imports: ~0.7 s of CPU each) runs beside the candidates and the plan's solve instead of after them; one of them
    evaluates part of the candidates meanwhile (:func:`evaluate_beside`). Those the analysis does not use are
    stopped (:meth:`close`)."""

    def __init__(self, n: int):
        self._procs: list[subprocess.Popen] = []
        self.pending: threading.Thread | None = None
        """The thread still talking to a worker about the candidates (:func:`evaluate_beside`), if any."""
        self.grow(n)

    def grow(self, n: int) -> None:
        """At least ``n`` workers (fewer where no interpreter starts: an embedded Python)."""
        try:
            while len(self._procs) < n:
                self._procs.append(_start_worker())
        except OSError:
            pass

    @property
    def count(self) -> int:
        """Workers started and not yet handed over."""
        return len(self._procs)

    def first(self) -> subprocess.Popen | None:
        """A started worker, lent (it stays among these for the analysis), or ``None``."""
        return self._procs[0] if self._procs else None

    def take(self, n: int) -> list[subprocess.Popen]:
        """``n`` workers for the analysis (started now where too few were), handed over: the rest are stopped."""
        if self.pending is not None:
            self.pending.join()  # done with the candidates: one talk at a time on a worker's pipes
            self.pending = None
        self.grow(n)
        procs, rest = self._procs[:n], self._procs[n:]
        self._procs = []
        for p in rest:
            _stop(p)
        return procs

    def close(self) -> None:
        for p in self._procs:
            _stop(p)
        self._procs = []
        if self.pending is not None:
            self.pending.join()  # its worker is stopped: it ends
            self.pending = None


def _stop(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()


def answer_in_workers(ctx, qs: list, jobs: int, workers: Workers | None = None) -> tuple[dict, bool]:
    """Answer ``qs`` on this process and ``jobs - 1`` workers (taken from ``workers`` where they were started
    ahead): ``(answers, cut)`` as :func:`answer_questions` gives them."""

    payload = pickle.dumps({
        "rs": ctx.rs, "pool": ctx.pool, "data": ctx.data, "plan": ctx.plan, "opts": ctx.opts,
        "base": {v.name: float(val) for v, val in ctx.base.items()} if ctx.base is not None else None,
        # perf_counter is per process: the deadline travels as wall-clock time
        "deadline": time.time() + (ctx.deadline - time.perf_counter()),
        "questions": qs,
    }, protocol=pickle.HIGHEST_PROTOCOL)
    ctx.say(f"analysis: {len(qs)} re-solves on {jobs} processes")
    lock = threading.Lock()
    queue = list(range(len(qs)))[::-1]  # popped from the end: asked in order
    answers: dict[int, object] = {}
    state = {"cut": False, "lost": [], "error": None}
    said: list[str] = []  # progress lines, told from the main thread: Pyomo captures the process's output while it solves

    def take() -> int | None:
        with lock:
            if state["error"] is not None or not queue:
                return None
            return queue.pop()

    def done(i: int, a) -> None:
        with lock:
            if a is None:
                state["cut"] = True
            else:
                answers[i] = a
            if a is not None:
                said.append(f"analysis: {len(answers)} of {len(qs)} re-solved ({qs[i].label})")

    def tell() -> None:
        with lock:
            lines, said[:] = list(said), []
        for line in lines:
            ctx.say(line)

    ready: set[int] = set()  # workers that have built their model and take questions

    def serve(k: int, proc: subprocess.Popen) -> None:
        """Feed one worker questions until none are left (runs on a thread; reads and writes release the GIL)."""
        i = None
        try:
            _send(proc.stdin, payload, raw=True)
            if pickle.load(proc.stdout) != READY:
                raise EOFError
            with lock:
                ready.add(k)
            while (i := take()) is not None:
                _send(proc.stdin, i)
                kind, value = pickle.load(proc.stdout)
                if kind == "error":
                    with lock:
                        state["error"] = state["error"] or value
                    return
                done(i, value)
                i = None
            _send(proc.stdin, STOP)
        except (OSError, EOFError, pickle.UnpicklingError):
            with lock:  # the worker died (or was stopped before it was ready): its question comes back here
                if i is not None:
                    state["lost"].append(i)

    # where no interpreter starts (an embedded Python) there are fewer workers, or none: the rest is answered here
    procs = (workers or Workers(0)).take(jobs - 1)
    threads = [threading.Thread(target=serve, args=(k, p), daemon=True) for k, p in enumerate(procs)]
    finished = False
    try:
        for t in threads:
            t.start()
        while (i := take()) is not None:
            done(i, _answer(ctx, qs[i]))
            tell()
        with lock:  # every question is taken: a worker still starting up has nothing left to do
            idle = [p for k, p in enumerate(procs) if k not in ready]
        for p in idle:
            p.kill()  # its thread sees the pipe close and ends
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.5)
            tell()
        if state["error"] is not None:
            raise state["error"]
        lost = sorted(state["lost"])
        if lost:  # re-solved here, in the order asked
            more, short = answer_here(ctx, [qs[i] for i in lost])
            answers.update({i: more[qs[i]] for i in lost if qs[i] in more})
            state["cut"] = state["cut"] or short
        finished = True
    finally:
        for p in procs:
            try:  # told to stop, a worker exits at once; one still busy (an error here, Ctrl-C) is stopped now
                p.wait(timeout=5 if finished else 0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return {qs[i]: answers[i] for i in range(len(qs)) if i in answers}, state["cut"]


def evaluate_beside(workers: Workers | None, rs, engine, levels, shares):
    """The candidate pool of :func:`planner.perf.candidates.evaluate_candidates`, evaluated here and on one of
    ``workers`` (where one was started): hardware by hardware, this process from the first, the worker from the
    last once it has started up (this process never waits for its start-up: where it has evaluated everything
    first, the worker takes nothing). Hardware the worker took but did not return (it died) is evaluated here; an
    error in the worker is raised here."""
    from planner.perf.candidates import evaluate_candidates, merge_pools

    ids = [h.id for h in rs.hardware]
    proc = workers.first() if workers is not None else None
    if proc is None or len(ids) < 2:
        return evaluate_candidates(rs, engine, levels, shares)
    cond = threading.Condition()
    ends = [0, len(ids)]  # the next hardware from the front (here), one past the next from the back (the worker)
    parts: dict[int, object] = {}
    state = {"holding": None, "lost": None, "error": None}

    def claim(back: bool) -> int | None:
        with cond:
            if ends[0] >= ends[1]:
                return None
            if back:
                ends[1] -= 1
                state["holding"] = ends[1]
                return ends[1]
            ends[0] += 1
            return ends[0] - 1

    def returned(i: int | None, kind: str, value) -> None:
        with cond:
            if kind == "pool":
                parts[i] = value
            elif kind == "error":
                state["error"] = value
            else:  # the worker died holding ``i``: evaluated here
                state["lost"] = i
            state["holding"] = None
            cond.notify_all()

    def serve() -> None:
        try:
            _send(proc.stdin, ("candidates", rs, engine, levels, shares))
            if pickle.load(proc.stdout) != READY:
                raise EOFError
            while (i := claim(back=True)) is not None:
                _send(proc.stdin, ids[i])
                kind, value = pickle.load(proc.stdout)
                returned(i, kind, value)
                if kind == "error":
                    return
            _send(proc.stdin, STOP)
        except (OSError, EOFError, pickle.UnpicklingError):
            returned(state["holding"], "lost", None)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    workers.pending = t  # the analysis waits for it before it talks to the worker
    try:
        while (i := claim(back=False)) is not None:
            parts[i] = evaluate_candidates(rs, engine, levels, shares, hardware=[ids[i]])
        with cond:
            cond.wait_for(lambda: state["holding"] is None)
    except BaseException:
        proc.kill()  # Ctrl-C or an error here: the worker's part is not wanted
        raise
    if state["error"] is not None:
        raise state["error"]
    if state["lost"] is not None:
        parts[state["lost"]] = evaluate_candidates(rs, engine, levels, shares, hardware=[ids[state["lost"]]])
    return merge_pools([parts[i] for i in range(len(ids))])


def _start_worker() -> subprocess.Popen:
    """A worker: a fresh interpreter that imports this very planner package (wherever the planning process found
    it: an installed copy elsewhere on the path would not do) without touching the import path of anything else."""
    pkg = Path(__file__).resolve().parents[1]  # the planner package (this module is planner/analysis/workers.py)
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('planner', {str(pkg / '__init__.py')!r}, "
            f"submodule_search_locations=[{str(pkg)!r}])\n"
            "mod = importlib.util.module_from_spec(spec); sys.modules['planner'] = mod; spec.loader.exec_module(mod)\n"
            "from planner.analysis.workers import main\n"
            "main()\n")
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _send(stream, obj, raw: bool = False) -> None:
    stream.write(obj if raw else pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    stream.flush()


def _worker_context(p: dict):
    """A worker's copy of the plan's model, the plan's solution on it and its own HiGHS instance."""
    import pyomo.core as pyo
    from pyomo.common.collections import ComponentMap

    from planner.analysis.context import AnalysisContext
    from planner.model import build_model
    from planner.solve import Solver

    model = build_model(p["data"])
    base = None
    if p["base"] is not None:
        base = ComponentMap((v, p["base"].get(v.name, 0.0)) for v in model.component_data_objects(pyo.Var))
    opts = p["opts"]
    # one HiGHS thread: the processes are the parallelism (HiGHS's own threads would only compete for the cores)
    solver = Solver(time_limit_s=opts.time_limit_s, mip_gap=opts.mip_gap, threads=1)
    deadline = time.perf_counter() + (p["deadline"] - time.time())
    return AnalysisContext(p["rs"], p["pool"], p["data"], model, solver, None, p["plan"], opts, deadline, base)


def main() -> None:
    """A worker: read the payload, then answer question indices from stdin until :data:`STOP`."""
    import signal

    import planner.analysis.questions  # noqa: F401  (the heavy imports, before the payload arrives)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the planning process's to handle
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not reach the answers' stream
    inp = sys.stdin.buffer
    payload = pickle.load(inp)
    if isinstance(payload, tuple) and payload[0] == "candidates":
        _evaluate_part(payload[1:], inp, out)
        payload = pickle.load(inp)
    ctx, qs = _worker_context(payload), payload["questions"]
    _send(out, READY)
    while (i := pickle.load(inp)) is not STOP:
        try:
            reply = ("answer", _answer(ctx, qs[i]))
        except Exception as e:  # a bug or bad input: the planning process raises it, as one process would
            reply = ("error", e)
        _send(out, reply)


def _evaluate_part(job, inp, out) -> None:
    """A worker's part of the candidate pool (:func:`evaluate_beside`): the hardware it is sent, one at a time, until
    :data:`STOP`."""
    from planner.perf.candidates import evaluate_candidates

    rs, engine, levels, shares = job
    _send(out, READY)
    while (hw := pickle.load(inp)) is not STOP:
        try:
            reply = ("pool", evaluate_candidates(rs, engine, levels, shares, hardware=[hw]))
        except Exception as e:  # raised by the planning process, as one process would
            reply = ("error", e)
        _send(out, reply)


def _answer(ctx, q):
    """``q``'s answer, or ``None`` where the time limit is spent."""
    from planner.analysis.context import OutOfTime
    from planner.analysis.questions import ask

    try:
        return ask(ctx, q)
    except OutOfTime:
        return None


MAX_ANALYSIS_JOBS = 4
"""At most this many analysis processes by default (each holds a copy of the model and the candidate pool)."""


PRESTART_MIN_WORKLOADS = 3
"""By default, a scenario of this many workloads starts its analysis workers while its candidates are evaluated."""


CANDIDATE_WORKER_MIN_WORKLOADS = 6
"""Without the analysis, by default a scenario of this many workloads starts one worker for its candidates alone:
they take ~0.35-0.45 s per workload on one core, and the worker's ~0.7 s start-up pays from about 2 s of them
(multi-workload.yaml, 3 workloads: 2.4 s wall either way, 0.6 s more CPU with one)."""


PARALLEL_MIN_SOLVE_S = 0.5
"""By default the analysis runs on several processes only where the plan's own solve took this long: each
question costs about one such solve, so below it a process start-up costs more than it saves."""


STARTED_MIN_SOLVE_S = 0.2
"""Workers started ahead (their start-up paid) are used where the plan's own solve took this long: below it,
handing them the plan costs more than the re-solves they would take (three-models.yaml: a 0.06 s solve, 0.4 s
of analysis)."""


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def prestart_workers(rs: ResolvedScenario, opts: PlanOptions):
    """Workers started before the candidates (:class:`planner.analysis.workers.Workers`): one evaluates part of the
    candidate pool as soon as it has started up, and the analysis will likely use them all: ``--jobs`` above 1, or
    by default a scenario of at least :data:`PRESTART_MIN_WORKLOADS` workloads on a machine of several cores (a
    fleet's plan; one that solves fast after all stops them unused, at ~0.7 s of CPU each on the other cores).
    Without the analysis, one for the candidates (``--jobs`` above 1, or by default
    :data:`CANDIDATE_WORKER_MIN_WORKLOADS` workloads). ``None`` where none are."""
    many = len(rs.scenario.workloads) >= (PRESTART_MIN_WORKLOADS if opts.analysis else CANDIDATE_WORKER_MIN_WORKLOADS)
    if opts.jobs is not None:
        n = opts.jobs - 1
    elif many:
        n = min(available_cores(), MAX_ANALYSIS_JOBS) - 1
    else:
        n = 0
    if not opts.analysis:
        n = min(n, 1)
    if n < 1:
        return None

    return Workers(n)


def analysis_jobs(opts: PlanOptions, questions: int, solve_s: float, started: int = 0) -> int:
    """Processes for ``questions`` re-solves after a plan solve of ``solve_s`` seconds (see ``PlanOptions.jobs``),
    ``started`` workers having been started ahead (their start-up is paid: from ``STARTED_MIN_SOLVE_S`` they are
    used all the same)."""
    if questions < 2:
        return 1
    if opts.jobs is not None:
        return max(1, min(opts.jobs, questions))
    if solve_s < PARALLEL_MIN_SOLVE_S:
        return min(1 + started, questions) if solve_s >= STARTED_MIN_SOLVE_S else 1
    return max(1, min(available_cores(), MAX_ANALYSIS_JOBS, questions))


def answer_questions(ctx: AnalysisContext, qs: list[Question], jobs: int = 1, workers=None) -> tuple[dict[Question, Answer], bool]:
    """Each question's answer, and whether the time limit stopped the analysis before every one was answered.
    With ``jobs`` > 1 the questions are re-solved on that many processes
    (:func:`planner.analysis.workers.answer_in_workers`; ``workers``: those started ahead, see
    :func:`prestart_workers`): each is independent of the others (every re-solve starts from the plan), so the
    answers are those of one process, found sooner."""
    tasks = together(qs)
    if jobs > 1 and len(tasks) > 1:
        got, cut = answer_in_workers(ctx, tasks, jobs, workers)
    else:
        got, cut = answer_here(ctx, tasks)
    answers: dict[Question, Answer] = {}
    for q, a in got.items():
        if q.kind == "together":
            answers.update(a.parts)
            cut = cut or a.cut
        else:
            answers[q] = a
    return answers, cut
