"""A finished run in the Hugging Face ecosystem: ``AutoTokenizer`` and
``AutoModelForCausalLM`` on the run folder, ``pipeline``, old runs, export for the Hub,
``transformers.Trainer``, PEFT LoRA and lm-evaluation-harness."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    pipeline,
)

from experiments.data.bpe import BPETokenizer
from experiments.data.hf_tokenizer import HF_TOKENIZER_FILES, hf_tokenizer, to_hf_tokenizer
from experiments.data.tokenization import SubwordTokenizer, load_tokenizer
from experiments.evaluation.hub import export_run
from experiments.evaluation.trained import load_run
from experiments.training.cards import save_run_model
from experiments.training.task import LMTask
from ode_transformer import ODETransformerLM

pytestmark = pytest.mark.slow  # many small models: the full suite runs them, the fast tier not

LINES = ["a dog sees this cat", "every small bird sleeps", "some cats see a dog"]


def test_a_run_loads_with_auto_classes(trained):
    run = load_run(trained)
    tokenizer = AutoTokenizer.from_pretrained(trained)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert tokenizer.eos_token == "<eos>" and tokenizer.eos_token_id == run.tokenizer.eos_id
    assert len(tokenizer) == run.tokenizer.vocab_size
    for line in LINES:
        ids = tokenizer(line)["input_ids"]
        assert ids == [0, *run.encode(line)]  # the <eos> before every prompt, as BOS
        assert tokenizer(line, add_special_tokens=False)["input_ids"] == run.encode(line)
        # each word with its space, as GPT-2's
        assert tokenizer.decode(ids, skip_special_tokens=True) == " " + line
    assert tokenizer("this cat <eos>")["input_ids"] == [0, *run.encode("this cat"), 0]
    assert tokenizer.bos_token_id == tokenizer.pad_token_id == tokenizer.eos_token_id == 0
    model = AutoModelForCausalLM.from_pretrained(trained / "model")
    assert isinstance(model, ODETransformerLM) and isinstance(model, PreTrainedModel)
    ids = torch.tensor([run.encode("a dog sees this cat") + [0] + run.encode(LINES[1])])
    torch.testing.assert_close(model(ids)[0], run.model(ids)[0], rtol=0, atol=0)
    # the HF loss is the library's training loss on the same batch
    loss = model(input_ids=ids, labels=ids).loss
    library, _ = LMTask(run.model, {"lr": 1e-3})._loss(ids)
    assert loss.item() == pytest.approx(library.item(), abs=1e-6)
    # HF generation equals the run's own
    prompt = torch.tensor([run.encode("a dog")])
    hf = model.generate(prompt, max_new_tokens=5, do_sample=False)
    assert hf[0].tolist() == run.model.generate(prompt, 5)[0].tolist()


def test_pipeline_generates_text(trained):
    generator = pipeline("text-generation", model=str(trained / "model"), tokenizer=str(trained))
    out = generator("a dog", max_new_tokens=4, do_sample=False)
    text = out[0]["generated_text"]
    # RUN/model holds the tokenizer files too, so the pipeline finds them alone
    alone = pipeline("text-generation", model=str(trained / "model"))
    assert alone("a dog", max_new_tokens=4, do_sample=False)[0]["generated_text"] == text
    assert text.startswith("a dog") and len(text.split()) > 2
    model = AutoModelForCausalLM.from_pretrained(trained / "model")
    expected = model.generate(
        torch.tensor([[0, *load_run(trained).encode("a dog")]]), max_new_tokens=4, do_sample=False
    )
    tokenizer = AutoTokenizer.from_pretrained(trained)
    # the words, each with its space
    assert " " + text == tokenizer.decode(expected[0], skip_special_tokens=True)


def _old_run(trained: Path, tmp_path: Path) -> Path:
    """A copy of the run as an earlier version wrote it: no HF tokenizer files, no
    ``model_type`` in config.json (the run marker records what that version recorded)."""
    old = tmp_path / "old"
    shutil.copytree(trained, old)
    for name in HF_TOKENIZER_FILES:
        (old / name).unlink()
        (old / "model" / name).unlink()
    config_path = old / "model" / "config.json"
    saved = json.loads(config_path.read_text())
    del saved["model_type"]
    config_path.write_text(json.dumps(saved, indent=2) + "\n")
    marker = json.loads((old / ".odelm-run").read_text())
    from odelm.pretrained import file_sha256

    files = {k: v for k, v in marker["files"].items() if Path(k).name not in HF_TOKENIZER_FILES}
    files["model/config.json"] = file_sha256(config_path)
    (old / ".odelm-run").write_text(json.dumps({**marker, "files": files}))
    return old


def test_an_old_run_loads_both_ways_without_being_written(trained, tmp_path):
    old = _old_run(trained, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in old.rglob("*")}
    run = load_run(old)  # the library way
    model = ODETransformerLM.from_pretrained(old / "model")  # a transformers model
    assert isinstance(model, PreTrainedModel) and model.config.model_type
    tokenizer = hf_tokenizer(old)  # built in memory
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert tokenizer(LINES[0])["input_ids"] == [0, *run.encode(LINES[0])]
    assert {p: p.stat().st_mtime_ns for p in old.rglob("*")} == before
    # an export is a Hugging Face folder: Auto classes and pipeline read it alone
    folder = export_run(old, tmp_path / "export")
    assert {p.name for p in folder.iterdir()} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    }
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([run.encode(LINES[2])])
    torch.testing.assert_close(loaded(ids)[0], run.model(ids)[0], rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(folder)(LINES[2])["input_ids"] == [0, *ids[0].tolist()]
    assert loaded.config.eos_token_id == loaded.generation_config.eos_token_id == 0
    text = pipeline("text-generation", model=str(folder))("this cat", max_new_tokens=3)
    assert text[0]["generated_text"].startswith("this cat")


FAMILIES = {
    "lstm": {"family": "neuralode_lm", "name": "lstm", "embed_dim": 16, "hidden_dim": 16},
    "ode-lstm": {
        "family": "neuralode_lm",
        "name": "ode-lstm",
        "embed_dim": 16,
        "hidden_dim": 16,
        "field_hidden": 8,
        "solver": {"method": "dopri5", "rtol": 1e-3, "atol": 1e-4},
    },
    "ode-gpt2": {
        "family": "neuralode_lm",
        "name": "ode-gpt2",
        "config": {"n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 64},
        "solver": {"method": "dopri5", "rtol": 1e-3, "atol": 1e-4},
    },
    "macaron": {
        "family": "ode_transformer",
        "preset": "small",
        "d_model": 16,
        "d_ff": 32,
        "n_heads": 2,
        "n_layers": 1,
        "stack": "macaron",
    },
    "node-transformer": {
        "family": "neuralode_lm",
        "name": "node-transformer",
        "d_model": 16,
        "n_heads": 2,
        "d_ff": 32,
        "n_layers": 1,
    },
    "reference": {
        "family": "reference",
        "name": "transformer",
        "d_model": 16,
        "n_heads": 2,
        "d_ff": 16,
        "n_layers": 1,
    },
}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_saved_as_a_run_loads_with_auto_classes(name, trained, tmp_path):
    from experiments.models.build import build_model

    tokenizer = load_tokenizer(trained / "tokenizer")
    torch.manual_seed(0)
    model = build_model(FAMILIES[name], tokenizer.vocab_size).eval()
    save_run_model(model, tmp_path, tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    hf_tok = AutoTokenizer.from_pretrained(tmp_path)
    assert type(loaded) is type(model)
    ids = torch.tensor([hf_tok("a dog sees this cat <eos> every small bird")["input_ids"]])
    torch.testing.assert_close(loaded(ids)[0], model(ids)[0], rtol=0, atol=0)
    text = pipeline("text-generation", model=loaded, tokenizer=hf_tok)("a dog", max_new_tokens=3)
    assert text[0]["generated_text"].startswith("a dog")
    prompt = ids[:, :3]
    assert torch.equal(
        loaded.generate(prompt, max_new_tokens=4, num_beams=2, do_sample=False),
        model.generate(prompt, 4, strategy="beam", num_beams=2),
    )


def test_bpe_tokenizer_encodes_as_the_library():
    lines = ["the cat sat on the mat", "a dog ran <unk> home", "the dog sat"] * 5
    bpe = SubwordTokenizer(BPETokenizer.train(lines, 300))
    hf = to_hf_tokenizer(bpe)
    assert isinstance(hf, PreTrainedTokenizerFast)
    assert hf.eos_token == "<eos>" and hf.unk_token == "<unk>"
    assert hf.eos_token_id == bpe.eos_id and hf.unk_token_id == bpe.bpe.unk_id
    for line in ["the cat sat", "a dog ran <unk> home", "cat mat dog", "zebra <unk>"]:
        ids = hf(line, add_special_tokens=False)["input_ids"]
        assert ids == bpe.encode_words(line.split())
        assert hf(line)["input_ids"] == [bpe.eos_id, *ids]  # the <eos> before it, as BOS
        if "<unk>" not in line:
            assert hf.decode(ids) == " " + bpe.bpe.decode(ids)  # each word with its space


def _grammar_windows(trained: Path, length: int = 17, count: int = 24) -> list[torch.Tensor]:
    ids = load_run(trained).data().split("train").ids
    return [ids[i * length : (i + 1) * length] for i in range(count)]


def test_transformers_trainer_trains_an_ode_transformer(trained, tmp_path):
    from transformers import Trainer, TrainingArguments

    run = load_run(trained)
    model = AutoModelForCausalLM.from_pretrained(trained / "model").train()
    windows = _grammar_windows(trained)
    dataset = [{"input_ids": w, "labels": w} for w in windows]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert result.global_step == 4
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert (
        "token_embedding.weight" in changed
        and "stack.layers.0.blocks.0.f.attention.attention.qkv.weight" in changed
    )
    # the first logged loss is the model's loss on the first batch, the library's training loss
    batch = torch.stack(windows[:4])
    trainer.save_model(str(tmp_path / "saved"))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    torch.testing.assert_close(saved(batch)[0], model.eval()(batch)[0], rtol=0, atol=0)
    assert run.model(batch)[0].shape == saved(batch)[0].shape


def test_peft_lora_on_the_attention_projections(trained):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft)")
    model = AutoModelForCausalLM.from_pretrained(trained / "model")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["qkv", "out"], lora_dropout=0.0)
    adapted = peft.get_peft_model(model, config)
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".attention.qkv.lora_A" in n for n in trainable)
    batch = torch.stack(_grammar_windows(trained, count=4))
    base = model(batch)[0].detach()
    out = adapted(input_ids=batch, labels=batch)
    torch.testing.assert_close(out.logits, base, rtol=0, atol=1e-6)  # LoRA B starts at zero
    optimizer = torch.optim.SGD([p for p in adapted.parameters() if p.requires_grad], lr=0.5)
    adapted.train()
    for _ in range(2):
        loss = adapted(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    adapted.eval()
    tuned = adapted(input_ids=batch).logits.detach()
    assert not torch.allclose(tuned, base)
    merged = adapted.merge_and_unload()
    assert isinstance(merged, ODETransformerLM)
    torch.testing.assert_close(merged(batch)[0], tuned, rtol=0, atol=1e-5)


def test_lm_evaluation_harness_scores_a_run_as_odelm_eval(trained, tmp_path):
    pytest.importorskip(
        "lm_eval",
        reason="lm-evaluation-harness is not installed: pip install 'odelm[harness]' "
        "(a separate extra: it pulls datasets, pandas, pyarrow and scikit-learn)",
    )
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    run = load_run(trained)
    task_file = tmp_path / "grammar.jsonl"
    task_file.write_text("".join(json.dumps({"text": f"{line} <eos>"}) + "\n" for line in LINES))
    docs = [json.loads(line) for line in task_file.read_text().splitlines()]
    lm = HFLM(  # lm_eval puts its prefix token (<eos>, the BOS) before a text itself
        pretrained=str(trained / "model"),
        tokenizer=str(trained),
        batch_size=1,
        device="cpu",
        add_bos_token=False,
    )
    requests = [
        Instance("loglikelihood_rolling", doc, (doc["text"],), index)
        for index, doc in enumerate(docs)
    ]
    scores = lm.loglikelihood_rolling(requests)
    for doc, score in zip(docs, scores):
        words = doc["text"].split()[:-1]
        tokens = len(words) + 1  # the words and the final <eos>, each predicted once
        # odelm eval's scoring of the same line (its stream starts after an <eos>, as
        # lm_eval's rolling windows start after the prefix token, here <eos>), per token
        library = -math.log(run.perplexity([" ".join(words)], per="token"))
        assert score / tokens == pytest.approx(library, abs=1e-4)
    # loglikelihood of a continuation: the same numbers from the request form
    context, continuation = "a dog sees", " this cat"
    ((ll, _greedy),) = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    ids = torch.tensor([run.encode("a dog sees this cat")])
    logp = run.model(ids)[0].log_softmax(-1)[0]
    expected = logp[2, ids[0, 3]] + logp[3, ids[0, 4]]
    assert ll == pytest.approx(expected.item(), abs=1e-4)


TASK = """task: odelm_grammar
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""


@pytest.mark.slow
def test_the_lm_eval_command_line_scores_a_local_task(trained, tmp_path, monkeypatch):
    """``python -m odelm.harness run --model hf ...`` (the README's command) on a local task
    file: its word perplexity is odelm's per-token perplexity of the same lines."""
    pytest.importorskip(
        "lm_eval",
        reason="lm-evaluation-harness is not installed: pip install 'odelm[harness]' "
        "(a separate extra: it pulls datasets, pandas, pyarrow and scikit-learn)",
    )
    from odelm.harness import main

    run = load_run(trained)
    data = tmp_path / "grammar.jsonl"
    data.write_text("".join(json.dumps({"text": f"{line} <eos>"}) + "\n" for line in LINES))
    (tmp_path / "odelm_grammar.yaml").write_text(TASK.format(data=data))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    main(
        [
            "run",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={trained / 'model'},tokenizer={trained}",
            "--tasks",
            "odelm_grammar",
            "--include_path",
            str(tmp_path),
            "--device",
            "cpu",
            "--batch_size",
            "1",
            "--output_path",
            str(tmp_path / "out"),
        ]
    )
    (results,) = (tmp_path / "out").rglob("results_*.json")
    ppl = json.loads(results.read_text())["results"]["odelm_grammar"]["word_perplexity,none"]
    # each line scored alone by odelm (a line's words and its <eos>: lm_eval's "words")
    nll = tokens = 0.0
    for line in LINES:
        count = len(line.split()) + 1
        nll += math.log(run.perplexity([line], per="token")) * count
        tokens += count
    assert ppl == pytest.approx(math.exp(nll / tokens), rel=1e-4)
