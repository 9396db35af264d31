"""The builders of one RL job, one module per part: :mod:`.context` (device, tokenizer, data,
sizes), :mod:`.policy`, :mod:`.reference`, :mod:`.critic`, :mod:`.rollout`, :mod:`.reward`;
:mod:`.engines` and :mod:`.sizes` hold what they share.  :func:`rlforge.trainer.build.build_job`
calls them in order and assembles the :class:`~rlforge.trainer.build.Job`."""
