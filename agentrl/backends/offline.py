"""transformers, imported with the hub switched off: nothing is fetched at run time (every load is also
`local_files_only`)."""
from __future__ import annotations

import os

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def transformers():
    """The transformers package, imported after OFFLINE is set, its logging below errors and progress bars off."""
    os.environ.update(OFFLINE)
    import transformers as tf
    tf.utils.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    return tf
