"""The shared-directory tier (`medium = "shared-fs"`): one file per block under a directory
many hosts mount. `kind.py` is its config table and declarations (imported when a config is
validated), `storage.py` its `SharedFSStorage` and opener."""
