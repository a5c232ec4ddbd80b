"""The seed MLP trained with Model.train on MNIST-format data (seeds 000/003/004, single device), then evaluated.

Written as a user would after `import mindspore as ms` → `import tessel as ms`; EPOCHS and DATA_PATH come from the
environment. Prints LossMonitor's lines, then "accuracy: <test accuracy>".
"""

import os

import tessel as ms
import tessel.dataset as ds
from tessel import nn, train

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(1)


def create_dataset(batch_size, usage):
    dataset = ds.MnistDataset(os.getenv("DATA_PATH"), usage=usage, shuffle=usage == "train")
    image_transforms = [
        ds.vision.Rescale(1.0 / 255.0, 0),
        ds.vision.Normalize(mean=(0.1307,), std=(0.3081,)),
        ds.vision.HWC2CHW(),
    ]
    dataset = dataset.map(image_transforms, "image")
    dataset = dataset.map(ds.transforms.TypeCast(ms.int32), "label")
    return dataset.batch(batch_size)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(), nn.Dense(512, 10)
        )

    def construct(self, x):
        return self.dense_relu_sequential(self.flatten(x))


net = Network()
optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer, metrics={"accuracy", "loss"})
model.train(int(os.getenv("EPOCHS", "5")), create_dataset(32, "train"), callbacks=[train.LossMonitor(100)])
print("accuracy:", model.eval(create_dataset(500, "test"))["accuracy"])
