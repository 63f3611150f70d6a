"""What a run measures, on the bottom floor so that models, actors and learners may record into
it: ``window`` (the learner's busy/wait/overhead, episodes and policy lag of each log window)
and ``health`` (dead units, logit spread and per-layer gradient norms of the policy network).
What a run writes and prints of it is ``reporting``'s."""
