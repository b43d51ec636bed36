"""Stage what a config needs from the Hugging Face hub into a data root, for machines without the hub:
``python stage.py --config configs/X.yaml --root DIR`` (installed: ``sentemb-stage``). The command lives in
``harness/stage.py``."""
import sys

if __name__ == "__main__":
    from harness.stage import main

    sys.exit(main())
