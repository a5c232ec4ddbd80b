"""Write an MNIST-format digits dataset (train 10000 / test 2000 by default) made from scikit-learn's 8x8 digits.

Usage: python examples/make_digits.py OUT_DIR [--train N] [--test N] [--seed S] [--gzip]

No download: the source images ship with scikit-learn. The files use MNIST's names and IDX layout, so
`ds.MnistDataset(OUT_DIR)` reads them, and DATA_PATH=OUT_DIR runs the seed tutorials.
"""

from __future__ import annotations

import argparse
import sys

from tessel.dataset.digits import write_mnist_digits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="folder to write the four IDX files into (created if missing)")
    parser.add_argument("--train", type=int, default=10000, help="training images (default 10000)")
    parser.add_argument("--test", type=int, default=2000, help="test images (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives identical files")
    parser.add_argument("--gzip", action="store_true", help="write .gz files as MNIST is distributed")
    args = parser.parse_args()
    for path in write_mnist_digits(args.out_dir, args.train, args.test, args.seed, args.gzip):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
