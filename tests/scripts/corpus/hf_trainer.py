"""Fine-tune a tiny causal LM with the Hugging Face Trainer (the run_clm shape).

torchrun --nproc-per-node 2 hf_trainer.py --model_dir tiny_llama --out out
"""

import argparse

import torch
from report import write
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
    set_seed,
)

TEXT = [f"line {i}: the quick brown fox jumps over the lazy dog {i * 7 % 13}" for i in range(64)]


class Lines(torch.utils.data.Dataset):
    def __init__(self, tokenizer, block: int) -> None:
        enc = tokenizer(TEXT, truncation=True, max_length=block, padding="max_length")
        self.items = [
            {"input_ids": ids, "attention_mask": m}
            for ids, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max_steps", type=int, default=4)
    args = parser.parse_args()
    set_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    config = AutoConfig.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_config(config)
    training_args = TrainingArguments(
        output_dir=f"{args.out}/trainer",
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Lines(tokenizer, 32),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    write(args.out, losses[-1], losses=losses, world=training_args.world_size)


if __name__ == "__main__":
    main()
