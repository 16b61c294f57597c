"""The ecosystem room: the workbook's worlds and models meeting the field's tools, beside the core, never inside it.

    trl_bridge.py      TRL's GRPOTrainer on a workbook world: the config mapping, the reward adapter, the loss cross-check
    endpoint.py        any OpenAI-compatible endpoint plays the episodes: ``python -m helpers.ecosystem.endpoint``
    openenv_server.py  a workbook env served over OpenEnv: ``python -m helpers.ecosystem.openenv_server shop``
    remote.py          the client of such a server, an env on TRL's contract: ``--env-class helpers.ecosystem.remote:RemoteEnv``

The core never imports this room (pyproject.toml's import contract); each module here imports the core.
"""
