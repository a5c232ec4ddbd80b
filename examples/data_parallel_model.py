"""The data-parallel seed with Model.train: the train step inserts the gradient reduction; the dataset is sunk.

python examples/make_digits.py /tmp/digits
DATA_PATH=/tmp/digits tessel run -n 2 examples/data_parallel_model.py    # logs: log_output/<job>/rank.<r>/stdout
"""

import os

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_group_size, get_rank, init

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()
ms.set_seed(1)


def create_dataset(batch_size):
    dataset_path = os.getenv("DATA_PATH")
    dataset = ds.MnistDataset(dataset_path, num_shards=get_group_size(), shard_id=get_rank())
    image_transforms = [ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.Normalize(mean=(0.1307,), std=(0.3081,)),
                        ds.vision.HWC2CHW()]  # fmt: skip
    dataset = dataset.map(image_transforms, "image")
    dataset = dataset.map(ds.transforms.TypeCast(ms.int32), "label")
    return dataset.batch(batch_size)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 512, weight_init="normal", bias_init="zeros"),
            nn.ReLU(),
            nn.Dense(512, 512, weight_init="normal", bias_init="zeros"),
            nn.ReLU(),
            nn.Dense(512, 10, weight_init="normal", bias_init="zeros"),
        )

    def construct(self, x):
        return self.dense_relu_sequential(self.flatten(x))


from tessel.train import LossMonitor  # noqa: E402

data_set = create_dataset(32)
net = Network()
model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=nn.SGD(net.trainable_params(), 1e-2))
model.train(int(os.getenv("EPOCHS", "10")), data_set, callbacks=[LossMonitor(10)], dataset_sink_mode=True)
