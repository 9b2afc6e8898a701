def pytest_addoption(parser):
    parser.addoption("--source-dir", required=True, help="the repository whose README and docs/ are checked")
    parser.addoption("--build-dir", required=True, help="the build the documented commands run (build/ in the docs)")
