# The plugin itself comes from the installed package's pytest11 entry point
# (harness.plugin); nothing needs importing here.  This file marks the
# repository root as pytest's rootdir for tests/ and scenarios/.
