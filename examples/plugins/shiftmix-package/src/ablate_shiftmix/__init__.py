"""The shift mixer as an installed plugin: registered by import paths, so importing it (every `ablate` command
does, through the entry point) costs no torch."""

import ablate

ablate.architecture("shiftmix", options="ablate_shiftmix.options", build="ablate_shiftmix.model",
                    description="the shift mixer, packaged: a gated per-channel average of the last `kernel` tokens")
