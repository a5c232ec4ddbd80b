"""The manual-parallel seed: every rank takes its rows of the batch by get_rank(), the loss is AllReduce'd.

python examples/make_digits.py /tmp/digits
DATA_PATH=/tmp/digits tessel run -n 2 examples/manual_parallel.py
"""

import os

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops, train
from tessel.communication import get_group_size, get_rank, init

ms.set_context(mode=ms.GRAPH_MODE)
init()
cur_rank = get_rank()
batch_size = 32
device_num = get_group_size()
shard_size = batch_size // device_num


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.layer1 = nn.Dense(28 * 28, 512)
        self.relu1 = nn.ReLU()
        self.layer2 = nn.Dense(512, 512)
        self.relu2 = nn.ReLU()
        self.layer3 = nn.Dense(512, 10)

    def construct(self, x):
        x = x[cur_rank * shard_size : cur_rank * shard_size + shard_size]
        x = self.flatten(x)
        x = self.relu1(self.layer1(x))
        x = self.relu2(self.layer2(x))
        return self.layer3(x)


def create_dataset():
    dataset = ds.MnistDataset(os.getenv("DATA_PATH"))
    image_transforms = [ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.Normalize(mean=(0.1307,), std=(0.3081,)),
                        ds.vision.HWC2CHW()]  # fmt: skip
    dataset = dataset.map(image_transforms, "image")
    dataset = dataset.map(ds.transforms.TypeCast(ms.int32), "label")
    return dataset.batch(batch_size, drop_remainder=True)


class ReduceLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.loss = nn.CrossEntropyLoss()
        self.all_reduce = ops.AllReduce()

    def construct(self, data, label):
        label = label[cur_rank * shard_size : cur_rank * shard_size + shard_size]
        loss_value = self.loss(data, label)
        return self.all_reduce(loss_value) / device_num


ms.set_seed(1)
net = Network()
data_set = create_dataset()
optimizer = nn.SGD(net.trainable_params(), 1e-2)
model = ms.Model(net, loss_fn=ReduceLoss(), optimizer=optimizer)
model.train(int(os.getenv("EPOCHS", "10")), data_set, callbacks=[train.LossMonitor(20)])
