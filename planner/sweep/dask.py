"""Sweeps on a Dask cluster (``planner sweep --backend dask [--scheduler ADDRESS]``).

Chunks of points run as Dask tasks (``planner.sweep.run_chunk``) on the workers of the scheduler at
``ADDRESS``, or of a ``LocalCluster`` of ``--jobs`` single-threaded worker processes when no address is
given. The catalog is sent to every worker once. Dask reschedules a task whose worker dies; the sweep
itself retries a failed chunk once more and then reports its points as failed (``planner.sweep.iter_sweep``).
"""

from __future__ import annotations

from planner.errors import InputError

CONNECT_TIMEOUT_S = 10


class DaskRunner:
    def __init__(self, scheduler: str | None, jobs: int, catalog):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InputError("--backend dask needs Dask's distributed package: pip install 'llm-serving-planner[dask]'") from None
        self._cluster = None
        if scheduler:
            try:
                self.client = Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
            except ValueError as err:
                raise InputError(f"--scheduler {scheduler}: not a scheduler address ({err}); write it tcp://HOST:8786, "
                                 "or leave --scheduler out for a local cluster") from None
            except (OSError, TimeoutError) as err:
                raise InputError(
                    f"--scheduler {scheduler}: no Dask scheduler answered within {CONNECT_TIMEOUT_S} s "
                    f"({type(err).__name__}); check the address (tcp://HOST:8786) or leave --scheduler out for a "
                    "local cluster") from None
        else:
            self._cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                         dashboard_address=None)
            self.client = Client(self._cluster)
        workers = self.client.scheduler_info().get("workers", {})
        self.slots = max(1, sum(int(w.get("nthreads", 1)) for w in workers.values()) or jobs)
        [self._catalog] = self.client.scatter([catalog], broadcast=True)

    def submit(self, chunk, path, opts, isolated: bool = False):  # Dask reschedules per task: always apart
        from planner.sweep.solving import run_chunk

        return self.client.submit(run_chunk, (chunk, self._catalog, path, opts), pure=False, retries=0)

    @staticmethod
    def wait(futures):
        from distributed import wait

        done, _ = wait(futures, return_when="FIRST_COMPLETED")
        return done

    @staticmethod
    def result(f):
        return f.result()

    def close(self, abort: bool) -> None:
        try:
            self.client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()
