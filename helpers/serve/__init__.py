"""The agent as a service that keeps learning from its users (持续学习), the parts of ``python -m helpers.serve``.

    store.py     every episode and every acknowledged piece of feedback, durably (SQLite, WAL, fsync per commit)
    world.py     the served shop: a customer's question becomes a task; the world can drift (what customers buy)
    agent.py     the loaded adapter versions, one worker batching requests into rollouts, the hot swap
    app.py       the HTTP face (FastAPI): OpenAI chat completions, feedback, status, the web page (page.html)
    trainer.py   the online trainer: verifiable feedback -> GRPO groups -> a candidate adapter -> the canary gate
    simulate.py  a simulated deployment: users (some adversarial), a drift, the learning agent against a frozen copy

Taught in notebooks/11_continual_learning.ipynb.
"""
