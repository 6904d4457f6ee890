# The history the case bisects: good -> unrelated docs commit -> the init change (HEAD).
set -euo pipefail
git tag good
echo "Tiny regression example." > NOTES.md
git add NOTES.md && git commit -q -m "docs: add notes"
cp next/train.py train.py
git commit -q -am "model: initialise the first layer's bias"
