"""Stage pretrained@<name>: pinned pretrained weights (agentrl.backends.pretrained) converted once into a
save_pretrained directory, data/models/<name>/ (DVC-cached, never in git): config.json, model.safetensors (fp32),
the tokenizer and its chat template, the package's LICENSE and agentrl_source.json (package, version, hashes, the
honest name). Outside the default pipeline (pretrained.models is empty by default):
`dvc exp run -S 'pretrained.models=[smollm2-135m-instruct]'`, or `python -m stages.pretrained --model
smollm2-135m-instruct` directly. Its input is what `make install` fetched, checked against the pins before any
compute; nothing is downloaded here."""
import resource
import time

from agentrl.backends.pretrained import check_gguf, pinned
from agentrl.core.config import PRETRAINED, UserError, load_section, read_params_file
from agentrl.pipeline.instances import StageArguments, matrix_instance
from agentrl.pipeline.stage import entry, run_stage

SECTIONS = ["pretrained"]
READS = {"run": ["threads", "numerics"]}   # the instance is its name; no pretrained key changes what it writes


def model_instance(name: str | None, params_path: str = "params.yaml") -> str:
    models = load_section("pretrained", read_params_file(params_path), params_path).models
    if name is not None and name not in PRETRAINED:
        raise UserError(f"--model: unknown value {name[:80]!r}; allowed: {', '.join(PRETRAINED)}")
    return matrix_instance("pretrained", {"model": list(models)}, {"model": name}, params_path)["model"]


def main(name: str | None = None):
    pin = pinned(model_instance(name))
    gguf = check_gguf(pin, pin.fetched())   # missing or not the pinned bytes: one line, before any compute
    source = {"package": pin.package, "version": pin.version, "license": pin.license, "wheel": pin.wheel,
              "wheel_sha256": pin.wheel_sha256, "member": pin.member, "sha256": pin.sha256,
              "honest_name": pin.honest_name}

    def body(ctx):
        from agentrl.backends.pretrained import convert
        start = time.perf_counter()
        record = convert(pin, gguf, pin.converted())
        wall = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # MiB (ru_maxrss is KiB on Linux)
        ctx.run.log_metrics({"wall_s": wall, "peak_memory_mib": peak, "parameters": record["parameters"],
                             "logits_max_abs_diff": record["logits_max_abs_diff"]})
        print(f"pretrained {pin.name}: {record['honest_name']} ({record['architecture']}, "
              f"{record['parameters']:,} parameters) -> {pin.converted()} in {wall:.0f} s, peak {peak:.0f} MiB; "
              f"logits within {record['logits_max_abs_diff']:.1g} of the GGUF model's")

    run_stage(f"pretrained@{pin.name}", SECTIONS, [gguf], body, only={"pretrained": [], "run": READS["run"]},
              sources={gguf.as_posix(): source})


if __name__ == "__main__":
    p = StageArguments(prog="pretrained")
    p.add_argument("--model")
    entry("pretrained", main, p.parse_args().model)
