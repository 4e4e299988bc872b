"""Training: the typed run config (`config`), building a run's parts (`build`), the RL loop (`loop`) with its
hooks (`hooks`), checks outside steps (`checks`), rollout -> TrainBatch (`batching`), the policy-gradient
learner (`learner`, `objectives`, `optim`), checkpoints and cold-start SFT."""
