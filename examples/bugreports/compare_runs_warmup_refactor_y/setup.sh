# The history the case bisects: good -> a docs commit -> the warmup refactor -> a logging commit (HEAD).
set -euo pipefail
git tag good
echo "Attention block trained with the noam schedule (warmup 8 steps)." > NOTES.md
git add NOTES.md && git commit -q -m "docs: describe the training setup"
cp next/lr_schedule.py lr_schedule.py
git commit -q -am "lr_schedule: split the warmup from the decay"
sed -i 's/^    sched.step()$/    sched.step()\n    print(f"step {step}: loss {loss.item():.4f}")/' train.py
git commit -q -am "train: print the loss at each step"
