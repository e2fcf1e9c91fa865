"""Builds the optional native CPU kernels (``jaxsparse_rows/_native/_kernels``).

Everything else is declared in ``pyproject.toml``. The extension is optional:
without a C++17 compiler, or without jaxlib's FFI headers in the build
environment, the install still succeeds and ``jsr.dot`` runs its XLA path.
"""

import glob
import importlib.metadata
import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _jaxlib_include() -> str:
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return ""
    include = Path(next(iter(spec.submodule_search_locations))) / "include"
    return str(include) if (include / "xla" / "ffi" / "api" / "ffi.h").exists() else ""


def _workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _compile_in_parallel(compiler) -> None:
    """Makes ``compiler.compile`` compile its sources on every core at once
    (distutils compiles one after another; the kernels took 61 s that way on
    a 2-core machine). The loop is distutils' own, with its private hooks;
    where those are missing the serial ``compile`` stays."""
    hooks = ("_setup_compile", "_get_cc_args", "_compile")
    if _workers() < 2 or not all(hasattr(compiler, h) for h in hooks):
        return

    def compile(
        sources,
        output_dir=None,
        macros=None,
        include_dirs=None,
        debug=False,
        extra_preargs=None,
        extra_postargs=None,
        depends=None,
    ):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        todo = [(obj, *build[obj]) for obj in objects if obj in build]
        with ThreadPoolExecutor(min(_workers(), max(len(todo), 1))) as pool:
            for f in [
                pool.submit(compiler._compile, obj, src, ext, cc_args, extra_postargs, pp_opts)
                for obj, src, ext in todo
            ]:
                f.result()  # raises the first compile error
        return objects

    compiler.compile = compile


class BuildKernels(build_ext):
    """Adds jaxlib's FFI headers; the library is loaded with ctypes, not imported."""

    def build_extension(self, ext):
        include = _jaxlib_include()
        if not include:
            message = f"{ext.name}: jaxlib's FFI headers not found"
            if not ext.optional:
                raise RuntimeError(message)
            self.warn(message + ", skipping the native kernels")
            return
        ext.include_dirs.append(include)
        # The jaxlib whose FFI headers these are: the kernels refuse to load
        # into an older jaxlib, whose XLA would reject their newer FFI version
        # (and fail to start its CPU backend).
        version = importlib.metadata.version("jaxlib")
        ext.define_macros.append(("JSR_BUILT_WITH_JAXLIB", f'"{version}"'))
        _compile_in_parallel(self.compiler)
        super().build_extension(ext)


kernels = Extension(
    "jaxsparse_rows._native._kernels",
    sources=sorted(glob.glob("jaxsparse_rows/_native/*.cc")),
    depends=sorted(glob.glob("jaxsparse_rows/_native/*.h")),
    language="c++",
    extra_compile_args=["-std=c++17", "-O3", "-DNDEBUG"],
    optional=os.environ.get("JAXSPARSE_ROWS_REQUIRE_NATIVE", "0") != "1",
)

setup(ext_modules=[kernels], cmdclass={"build_ext": BuildKernels})
