/// Items compiled only with the `zmq` feature, marked as such in the docs.
#[macro_export]
#[doc(hidden)]
macro_rules! cfg_zmq {
    ($($item:item)*) => {
        $(
            #[cfg(feature = "zmq")]
            $item
        )*
    };
}
