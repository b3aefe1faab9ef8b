"""faser-sglang: the FASER speculative-decoding algorithm as an SGLang plugin.

Installing the package registers ``--speculative-algorithm FASER`` with SGLang
through the ``sglang.srt.plugins`` entry point (see ``faser_sglang.plugin``).
"""

__version__ = "0.1.0"
