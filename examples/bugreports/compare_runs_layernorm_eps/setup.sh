# The history the case bisects: good -> a docs commit -> the epsilon change -> a docs commit (HEAD).
set -euo pipefail
git tag good
echo "Encoder block example." > NOTES.md
git add NOTES.md && git commit -q -m "docs: add notes"
cp next/train.py train.py
git commit -q -am "encoder: use BERT's layer-norm epsilon"
echo "Uses BERT's epsilon." >> NOTES.md
git commit -q -am "docs: mention the epsilon"
