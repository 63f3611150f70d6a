"""What pyproject.toml cannot say: ship the top-level ``conf/`` (Hydra's config tree) inside
the package as ``impala_gpu/conf``, so an installed wheel carries it. A checkout (and an
editable install of one) keeps it beside the package; ``impala_gpu.config.conf_dir()`` looks
in both places, the one lookup everything uses."""

from setuptools import find_namespace_packages, find_packages, setup

# conf/'s group folders (env, model, algo, ...) hold only YAML: setuptools ships a folder's
# files only as some package's data, so each is listed as a (namespace) package of its own.
CONF = ["impala_gpu.conf", *(f"impala_gpu.conf.{g}" for g in find_namespace_packages("conf"))]

setup(
    packages=[*find_packages(include=["impala_gpu", "impala_gpu.*"]), *CONF],
    package_dir={"impala_gpu.conf": "conf"},
    package_data={name: ["*.yaml"] for name in CONF},
)
