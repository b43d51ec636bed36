"""The shipped configs, installed as the package ``sentemb_configs`` (``sentemb-configs`` lists them)."""
