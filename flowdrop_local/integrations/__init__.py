"""Drop-in adapters for agent frameworks (faces: they translate, the store decides).

Each integration imports its framework, so it is installed through an extra:
``pip install 'flowdrop-local[openai-agents]'`` for
:mod:`flowdrop_local.integrations.openai_agents`.
"""
