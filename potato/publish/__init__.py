"""Publishing a run's model to the Hugging Face Hub, and downloading it, with a model card.

One job per module (layers top-down; nothing here imports the web server):

- ``errors``  every refusal and Hub failure, its message built once, with its fix;
- ``facts``   what a run learned from, in counts (``training-data.json``, written at
  build-bundle), and everything else the card says, read from the run's directory;
- ``card``    the card (README.md with the Hub's YAML front matter): pure rendering;
- ``plan``    what would be published for a run — its model's files, rewritten where
  they name this server's paths, and the card — or why nothing can be;
- ``hub``     the upload through ``huggingface_hub``'s ``HfApi``, with progress in bytes;
- ``record``  the run's ``publication`` in the store: claiming it, progress, the outcome;
- ``archive`` the same files as one streamed ``.tar.gz`` (the run page's download).

The token (``HF_TOKEN``, else the one ``hf auth login`` stored) is read where the
upload starts and handed only to ``HfApi``: it is never written to the store, a
log, a Prefect artifact or a page, and never reaches a GPU host or an agent.
"""
