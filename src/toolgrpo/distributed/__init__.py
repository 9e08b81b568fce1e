"""Ray mode: rollout workers as Ray actors (``trainer.distributed.backend=ray``).

``pool.RolloutPool`` starts the workers, pushes versioned weights, splits rollout calls across
them and replaces workers that die or hang; ``worker.RolloutWorker`` is one worker;
``frontends`` holds the ``Generator`` and ``EpisodeRunner`` the trainer sees. Ray is imported only
when a pool starts, so the rest of toolgrpo never needs it.
"""
